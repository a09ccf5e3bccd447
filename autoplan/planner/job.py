"""Planning inside a distributed job: one rank plans, every rank gets the plan.

Input: a function that plans on this process, the job's mesh and the rank to plan on.
Output: the same :class:`~autoplan.result.plan.Plan` on every rank of the job, sent as JSON
with ``torch.distributed.broadcast_object_list`` over the job's default group; a
failure on the planning rank is raised on every rank (the planning rank's own error
there; elsewhere a ``PlanError`` naming it if it was bad input, else a ``RuntimeError``) rather than leaving the others waiting.

Why: planning is deterministic, so every rank may plan for itself, but a solver time
limit makes the plan depend on the machine's speed at that moment, and the ranks of a
job share machines: one rank planning is both cheaper and certain to agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.core.errors import PlanError
from autoplan.result.plan import Plan

__all__ = ["in_fake_group", "plan_on_one_rank"]


def in_fake_group() -> bool:
    """Whether this process's default group is autoplan's fake one (planning only)."""
    return dist.is_initialized() and dist.get_backend() == "fake"


def plan_on_one_rank(make: Callable[[], Plan], mesh: DeviceMesh, src: int) -> Plan:
    """``make()`` on rank ``src`` of the job, its plan sent to every rank."""
    if in_fake_group():  # a planning mesh: this process is the only one
        return make()
    if not dist.is_initialized():
        raise PlanError(
            f"broadcast_from={src} sends the plan over the job's process group, and none is "
            "initialized: call torch.distributed.init_process_group first (torchrun sets its "
            "environment), or leave broadcast_from out to plan on this process alone."
        )
    world = dist.get_world_size()
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < world:
        raise PlanError(f"broadcast_from={src!r} must be a rank of the job, 0 to {world - 1}.")
    if mesh.size() != world:
        raise PlanError(
            f"broadcast_from={src} needs the mesh to span every rank of the job: the mesh "
            f"{tuple(mesh.shape)} has {mesh.size()} ranks, the job {world}. Plan on a mesh of "
            "the whole job, or leave broadcast_from out and plan on every rank."
        )
    box: list[tuple[str, str] | None] = [None]
    error: Exception | None = None
    if dist.get_rank() == src:
        try:
            box[0] = ("plan", make().to_json(timings=True))
        except Exception as e:  # sent on, so that no other rank waits for a plan
            error = e
            kind = "bad input" if isinstance(e, PlanError) else "error"
            box[0] = (kind, f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=src)
    if error is not None:
        raise error
    assert box[0] is not None
    kind, text = box[0]
    if kind == "bad input":  # the same user mistake on every rank, as the same kind of error
        raise PlanError(f"planning on rank {src} (broadcast_from={src}) failed: {text}")
    if kind == "error":
        raise RuntimeError(f"planning on rank {src} (broadcast_from={src}) failed: {text}")
    return Plan.from_json(text, source=f"the plan broadcast from rank {src}")
