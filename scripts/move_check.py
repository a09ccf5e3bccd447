"""Run one redistribution on a fake mesh and compare it with its price: shared by
``scripts/strided_moves.py`` and ``scripts/plan_moves.py`` (a helper, not a script).

Input: the mesh (a process group of :func:`autoplan.fake_mesh`, inside ``LocalTensorMode``
with :func:`autoplan.runtime.execute.flatten_mesh_groups` done), a :class:`RedistributeModel`,
source and target placements and a small shape. Output: the collectives that ran, the
ones priced, the tensor the move gave and the one it started from; :func:`right_values`
says whether the move gave the shards ``distribute_tensor`` makes of that tensor.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from autoplan.core.placements import Placements
from autoplan.core.torch_adapter import Partial, Replicate, redistribute
from autoplan.cost.redistribute import RedistributeModel
from autoplan.runtime.execute import collective_counts, move

Counts = dict[str, int]


def run_move(
    mesh,
    model: RedistributeModel,
    src: Placements,
    dst: Placements,
    shape: tuple[int, ...],
    via: Callable[..., DTensor] = move,
) -> tuple[Counts, Counts | None, DTensor, torch.Tensor]:
    """(collectives run, collectives priced or None if priced impossible, result, input):
    ``x = arange`` of ``shape`` placed as ``src`` (a Partial axis holds x on its first rank
    and 0 elsewhere, DTensor's local R -> P) and moved to ``dst`` by ``via``."""
    steps = model.steps(src, dst, shape, 4)
    priced = None if steps is None else dict(Counter(kind for kind, *_ in steps))
    x = torch.arange(float(math.prod(shape))).reshape(shape)
    cleared = [Replicate() if isinstance(p, Partial) else p for p in src]
    start = redistribute(distribute_tensor(x, mesh, cleared, src_data_rank=None), mesh, src)
    with CommDebugMode() as comm:
        out = via(start, mesh, dst)
    return collective_counts(comm.get_comm_counts()), priced, out, x


def right_values(mesh, out: DTensor, x: torch.Tensor, dst: Placements) -> bool:
    """Whether every rank holds the shard ``distribute_tensor(x, mesh, dst)`` gives it.

    Shards, not ``full_tensor()``: DTensor's own gather is wrong for some strided layouts
    (``_S(0,1)_S(0,2)`` gathers to another tensor than the one it holds, ``_S(0,2)_S(0,2)``
    raises), which would blame the move. A target with a ``Partial`` axis has no shard of
    its own to compare with, so its sum (``full_tensor``) is compared with ``x``.
    """
    if any(isinstance(p, Partial) for p in dst):
        return torch.equal(out.full_tensor(), x)
    a, b = out.to_local(), distribute_tensor(x, mesh, list(dst), src_data_rank=None).to_local()
    return all(torch.equal(a._local_tensors[r], b._local_tensors[r]) for r in a._local_tensors)
