"""Timing on every rank at once: the slowest rank's time, median over repeats.

Stage: used by the measuring modules of :mod:`autoplan.calibrate`.
Input: a callable to time, run on every rank of the job at the same moment.
Output: its time in microseconds: per repeat the slowest rank's (a step waits for it),
then the median over the repeats (one descheduled repeat does not move it); the timed
callables take turns, a repeat each per round.
Why one place: every figure a calibration writes is timed the same way. All ranks
start together after a barrier, so the ranks sharing a node (CPU cores, a PCIe switch,
a NIC) load it as a step does. The functional collectives run through an
:class:`autoplan.runtime.release.Keeper`, as a lowered program runs them, so no buffer is left
on a process group's worker thread when a measurement returns.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from autoplan.runtime.release import Keeper

__all__ = ["Clock", "middle_mean"]

_C10D = torch.ops._c10d_functional


class Clock:
    """Times callables on every rank of the job's default group; owns the keeper of the
    collectives it and its callers run (:meth:`collective`, :meth:`wait`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.keeper = Keeper()
        self._world = dist.group.WORLD
        self._cuda = device.type == "cuda"
        self._queued: list[tuple[Callable[[], Any], int, int]] = []

    def collective(self, op: Callable[..., Any]) -> Callable[..., Any]:
        """``op`` (a ``_c10d_functional`` collective) run through this clock's keeper."""
        return self.keeper.collective(op)

    def wait(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.keeper.wait(tensor)

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA); nothing on a CPU."""
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self._cuda:
            dist.barrier(self._world, device_ids=[self.device.index or 0])
        else:
            dist.barrier(self._world)

    def add(
        self, run: Callable[[], Any], *, repeats: int, min_us: float = 0.0, max_inner: int = 1
    ) -> None:
        """Queue ``run`` to be timed ``repeats`` times by :meth:`settle`, after an untimed
        call now. Every rank must call it alike.

        With ``min_us``, one timed repeat calls ``run`` as often as it takes (at most
        ``max_inner`` times) to last ``min_us`` on the slowest rank of a second untimed call:
        the ranks leave a barrier up to a few milliseconds apart, and only a repeat much
        longer than that has every rank running at once.
        """
        run()  # the first call pays for one-time set-up (allocations, kernels' plans)
        self.sync()
        inner = 1
        if min_us > 0 and max_inner > 1:
            start = time.perf_counter()
            run()
            self.sync()
            once = self.max_over_ranks([(time.perf_counter() - start) * 1e6])[0]
            inner = max(1, min(max_inner, math.ceil(min_us / max(once, 1e-3))))
        self._queued.append((run, repeats, inner))

    def settle(self) -> list[float]:
        """The microseconds of every :meth:`add` since the last settle, in order: per repeat
        the slowest rank's time, median over the repeats.

        The queued callables take turns, one repeat each per round, so a burst of load
        from elsewhere on the machine slows one repeat of many, not every repeat of one.
        The slowest rank is found with one collective for all.
        """
        seconds: list[list[float]] = [[] for _ in self._queued]
        for round_ in range(max((r for _, r, _ in self._queued), default=0)):
            for i, (run, repeats, inner) in enumerate(self._queued):
                if round_ >= repeats:
                    continue
                self.barrier()
                seconds[i].append(self._repeat(run, inner))
        self._queued = []
        slowest = self.max_over_ranks([s for mine in seconds for s in mine])
        out, at = [], 0
        for mine in seconds:
            out.append(statistics.median(slowest[at : at + len(mine)]) * 1e6)
            at += len(mine)
        self.keeper.settle()
        return out

    def _repeat(self, run: Callable[[], Any], inner: int) -> float:
        """Seconds per call of ``run`` over one repeat of ``inner`` calls.

        On a CPU, each call is timed and the mean of the middle half is taken: the ranks
        leave the barrier up to a few milliseconds apart, and in the first and last calls
        some of them run alone, faster than a step's ranks, which all run at once. The mean,
        not the median: ranks that share cores each run part of the time, and a short call
        runs whole or waits whole, so the median call is one that had a core to itself. A
        GPU queues its calls, so the repeat is timed whole.
        """
        start = time.perf_counter()
        if self._cuda or inner < 8:
            for _ in range(inner):
                run()
            self.sync()
            return (time.perf_counter() - start) / inner
        marks = [start]
        for _ in range(inner):
            run()
            marks.append(time.perf_counter())
        return middle_mean([b - a for a, b in zip(marks, marks[1:], strict=False)])

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Each value's maximum over the job's ranks (float64)."""
        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        held = self.collective(_C10D.all_reduce)
        assert self._world is not None, "calibrate runs in a job with a default group"
        out = self.wait(held(local, "max", self._world.group_name))
        self.sync()
        return out.cpu().tolist()


def middle_mean(calls: list[float]) -> float:
    """The mean of the middle half of ``calls`` (in call order): the first and last
    quarters dropped, every call between counted, the slow ones too."""
    quarter = len(calls) // 4
    return statistics.fmean(calls[quarter : len(calls) - quarter])
