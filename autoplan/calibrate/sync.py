"""Measuring the wait a collective adds when the ranks reach it from compute.

Stage: measurement, after :mod:`autoplan.calibrate.comm` and
:mod:`autoplan.calibrate.compute`.
Input: the job's measured groups, the
:class:`~autoplan.calibrate.settings.Settings` and a
:class:`~autoplan.calibrate.timing.Clock`.
Output: per group and burst length, a :class:`SyncSample`: the slowest rank's time for a
burst of matmuls, for the smallest all_reduce alone, and for the burst followed by the
all_reduce, and their difference, ``penalty_us``; :func:`fit_sync` fits the penalties
as ``sync_us + skew x burst`` (``collectives.sync_us`` and ``collectives.skew``).
Why: the collective fits are measured with the ranks leaving a barrier together, but in
a step each collective follows compute, and the ranks reach it at different moments
(ranks sharing cores are time-sliced by the scheduler; GPUs' kernels finish apart); the
first to arrive waits for the last, once per collective the step waits on, and the
longer they computed since they last met, the further apart they arrive. The burst is a
fixed number of calls, the same work on every rank, as a step's segments are. The fit
is Theil-Sen's (the median of the pairwise slopes): on ranks sharing cores a single
penalty can be several times its neighbours, and a least-squares line follows it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from scipy.stats import theilslopes

from autoplan.calibrate.comm import message_bytes
from autoplan.calibrate.groups import MeasuredGroup
from autoplan.calibrate.settings import Settings
from autoplan.calibrate.timing import Clock

__all__ = ["SyncSample", "fit_sync", "measure_sync"]

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


def measure_sync(
    groups: Sequence[MeasuredGroup], settings: Settings, clock: Clock
) -> list[SyncSample]:
    """On every group, for each of :meth:`Settings.sync_bursts`: the burst, the smallest
    all_reduce, and the two in a row, timed alike."""
    n = settings.matmul_n
    a = torch.rand(n, n, device=clock.device)
    b = torch.rand(n, n, device=clock.device)
    reduce = clock.collective(_C10D.all_reduce)
    samples = []
    for group in groups:
        x = torch.ones(
            message_bytes(settings.comm_min_bytes, group.ranks) // 4, device=clock.device
        )
        name = group.group.group_name

        def collective(x: torch.Tensor = x, name: str = name) -> None:
            clock.wait(reduce(x, "sum", name))

        for calls in settings.sync_bursts():

            def burst(calls: int = calls) -> None:
                for _ in range(calls):
                    a @ b

            def both(burst: Callable[[], None] = burst) -> None:
                burst()
                collective()

            for run in (burst, collective, both):
                clock.add(run, repeats=settings.sync_repeats)
            burst_us, collective_us, both_us = clock.settle()
            samples.append(SyncSample(group.label, burst_us, collective_us, both_us))
    return samples


def fit_sync(samples: Sequence[SyncSample]) -> tuple[float, float]:
    """``(sync_us, skew)``: the penalty after no compute, and its growth per us of it
    (Theil-Sen's line through every sample, both at least 0)."""
    if not samples:
        raise ValueError("fit_sync needs at least one sample")
    xs = [s.burst_us for s in samples]
    ys = [s.penalty_us for s in samples]
    if len(set(xs)) < 2:
        return max(0.0, statistics.median(ys)), 0.0
    slope, intercept, _, _ = theilslopes(ys, xs)
    skew = max(0.0, float(slope))
    if skew == 0.0:
        intercept = statistics.median(ys)
    return max(0.0, float(intercept)), skew
