"""Measuring collectives: each op the cost model prices, on each group, at each size.

Stage: measurement, after :mod:`autoplan.calibrate.groups`.
Input: this rank's groups, the :class:`~autoplan.calibrate.settings.Settings`, a
:class:`~autoplan.calibrate.timing.Clock`.
Output: a :class:`CollectiveSample` per (op, group, size): the slowest rank's median
time, with the message size in nccl-tests' convention (all_gather and reduce_scatter:
the whole gathered buffer; all_reduce: the buffer; all_to_all: one rank's send buffer),
the convention :class:`autoplan.core.measured.LinkFit` prices.
Why these ops: they are what a lowered plan runs (``_c10d_functional`` all_reduce,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, then wait_tensor),
called here the same way, on float32 buffers (gloo's and a CPU plan's dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from autoplan.calibrate.groups import MeasuredGroup
from autoplan.calibrate.settings import Settings
from autoplan.calibrate.timing import Clock
from autoplan.core.measured import OPS

__all__ = ["CollectiveSample", "measure_collectives"]

_C10D = torch.ops._c10d_functional
_DTYPE = torch.float32
_ELEMENT = 4


@dataclass(frozen=True)
class CollectiveSample:
    """One measured collective."""

    op: str
    group: str
    """The group's label (``dp``, ``dp+tp``)."""
    link: str
    ranks: int
    nbytes: int
    """nccl-tests' size."""
    time_us: float


def message_bytes(size: int, ranks: int) -> int:
    """``size`` rounded up to whole float32 elements that split evenly over ``ranks``."""
    chunk = ranks * _ELEMENT
    return max(chunk, -(-size // chunk) * chunk)


def measure_collectives(
    groups: list[MeasuredGroup],
    settings: Settings,
    clock: Clock,
    progress: Callable[[str], None] | None = None,
) -> list[CollectiveSample]:
    """Every op of :data:`autoplan.core.measured.OPS` on every group at every size."""
    samples: list[CollectiveSample] = []
    for g in groups:
        if progress is not None:
            progress(f"comm {g.label}")
        keys = []
        for op in OPS:
            for size in settings.comm_sizes():
                nbytes = message_bytes(size, g.ranks)
                run = _call(op, g, nbytes, clock)
                clock.add(run, repeats=settings.repeats(nbytes))
                keys.append((op, nbytes))
        times = clock.settle()
        samples += [
            CollectiveSample(op, g.label, g.link, g.ranks, nbytes, t)
            for (op, nbytes), t in zip(keys, times, strict=True)
        ]
    return samples


def _call(op: str, g: MeasuredGroup, nbytes: int, clock: Clock) -> Callable[[], torch.Tensor]:
    """One call of ``op`` on a buffer of ``nbytes`` (nccl-tests' size), waited for."""
    n, name = g.ranks, g.group.group_name
    numel = nbytes // _ELEMENT
    device = clock.device
    held = clock.collective(getattr(_C10D, _FUNCTIONAL[op]))
    if op == "all_gather":  # each rank sends its share of the gathered buffer
        x = torch.ones(numel // n, dtype=_DTYPE, device=device)
        return lambda: clock.wait(held(x, n, name))
    x = torch.ones(numel, dtype=_DTYPE, device=device)
    if op == "all_reduce":
        return lambda: clock.wait(held(x, "sum", name))
    if op == "reduce_scatter":
        return lambda: clock.wait(held(x, "sum", n, name))
    splits = [numel // n] * n
    return lambda: clock.wait(held(x, splits, splits, name))


_FUNCTIONAL = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_to_all": "all_to_all_single",
}
