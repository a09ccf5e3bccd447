"""Measuring the wait a collective adds when the ranks reach it from compute.

Stage: measurement, after :mod:`autoplan.calibrate.comm` and
:mod:`autoplan.calibrate.compute`.
Input: the job's largest measured group, the
:class:`~autoplan.calibrate.settings.Settings` and a
:class:`~autoplan.calibrate.timing.Clock`.
Output: a :class:`SyncSample`: the slowest rank's time for a burst of matmuls, for the
smallest all_reduce alone, and for the burst followed by the all_reduce, and their
difference, ``penalty_us``, which the fit writes as ``collectives.sync_us``.
Why: the collective fits are measured with the ranks leaving a barrier together, but in
a step each collective follows compute, and the ranks reach it at different moments
(ranks sharing cores are time-sliced by the scheduler; GPUs' kernels finish apart); the
first to arrive waits for the last, once per collective the step waits on. The burst is
a fixed number of calls, the same work on every rank, as a step's segments are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autoplan.calibrate.comm import message_bytes
from autoplan.calibrate.groups import MeasuredGroup
from autoplan.calibrate.settings import Settings
from autoplan.calibrate.timing import Clock

__all__ = ["SyncSample", "measure_sync"]

_C10D = torch.ops._c10d_functional


@dataclass(frozen=True)
class SyncSample:
    """One measurement of the arrival wait, on one group."""

    group: str
    burst_us: float
    collective_us: float
    both_us: float

    @property
    def penalty_us(self) -> float:
        """What the collective costs after the burst beyond its time alone (never < 0)."""
        return max(0.0, self.both_us - self.burst_us - self.collective_us)


def measure_sync(group: MeasuredGroup, settings: Settings, clock: Clock) -> SyncSample:
    """The burst, the smallest all_reduce on ``group``, and the two in a row, timed alike."""
    n = settings.matmul_n
    a = torch.rand(n, n, device=clock.device)
    b = torch.rand(n, n, device=clock.device)
    x = torch.ones(message_bytes(settings.comm_min_bytes, group.ranks) // 4, device=clock.device)
    reduce = clock.collective(_C10D.all_reduce)
    name = group.group.group_name

    def burst() -> None:
        for _ in range(settings.sync_burst_calls):
            a @ b

    def collective() -> None:
        clock.wait(reduce(x, "sum", name))

    def both() -> None:
        burst()
        collective()

    for run in (burst, collective, both):
        clock.add(run, repeats=settings.sync_repeats)
    burst_us, collective_us, both_us = clock.settle()
    return SyncSample(group.label, burst_us, collective_us, both_us)
