"""Meshes for planning: a fake process group of any size on one CPU.

Input: a mesh shape and axis names. Output: a ``DeviceMesh`` over a fake
process group (backend ``"fake"``): collectives are no-ops, so a 512-rank
mesh costs nothing, yet DTensor's sharding rules see a real mesh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoplan.core.errors import PlanError
from autoplan.core.torch_adapter import init_fake_process_group


def fake_mesh(shape: Sequence[int], names: Sequence[str]) -> DeviceMesh:
    """A ``DeviceMesh`` of ``shape`` named ``names`` on a fake process group.

    The default process group becomes a fake one of exactly ``prod(shape)`` ranks, so
    calling this again with another shape works (earlier fake meshes then become stale:
    plan with the latest one). It only ever destroys a fake group it created itself: a
    fake group of ``prod(shape)`` ranks, whoever made it, is used as it is; a job's
    group (gloo, nccl) or a fake group of another size made with ``torch.distributed``
    is left alone and raises :class:`PlanError` (inside a job, plan on the job's own
    mesh instead).
    """
    shape = tuple(shape)
    names = tuple(names)
    if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
        raise PlanError(
            f"mesh shape {shape!r} must be a non-empty tuple of positive ints, e.g. (8, 8)."
        )
    if len(names) != len(shape):
        raise PlanError(
            f"mesh names {names!r} must give one name per axis of shape {shape!r}, e.g. ('dp', 'tp')."
        )
    if len(set(names)) != len(names):
        raise PlanError(f"mesh names {names!r} must be distinct.")
    init_fake_process_group(math.prod(shape))
    return init_device_mesh("cpu", shape, mesh_dim_names=names)
