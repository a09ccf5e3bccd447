"""Timing on every rank at once: the slowest rank's time, median over repeats.

Stage: used by the measuring modules of :mod:`autoplan.calibrate`.
Input: a callable to time, or a rotation of callables called in turn as a program calls
its ops, run on every rank of the job at the same moment.
Output: each callable's time in microseconds: per repeat the slowest rank's (a step
waits for it), then the median over the repeats (one descheduled repeat does not move
it); the timed entries take turns, a repeat each per round.
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from autoplan.runtime.release import Keeper

__all__ = ["Clock", "middle_mean", "share_turns"]

_C10D = torch.ops._c10d_functional


class Clock:
    """Times callables on every rank of the job's default group; owns the keeper of the
    collectives it and its callers run (:meth:`collective`, :meth:`wait`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.keeper = Keeper()
        self._world = dist.group.WORLD
        self._cuda = device.type == "cuda"
        self._queued: list[tuple[tuple[Callable[[], Any], ...], int, int]] = []

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
        self.add_rotation([run], repeats=repeats, min_us=min_us, max_inner=max_inner)

    def add_rotation(
        self,
        runs: Sequence[Callable[[], Any]],
        *,
        repeats: int,
        min_us: float = 0.0,
        max_inner: int = 1,
    ) -> None:
        """Queue ``runs`` to be timed as :meth:`add` times one, but called in turn (the
        first, the second, ..., the first again) and each timed on its own calls; they
        count as ``len(runs)`` results of :meth:`settle`.

        A program runs many ops in turn, and each op's dispatch finds its code and data
        gone from the caches the others used; an op called in a loop of itself never
        does, and on a CPU takes a fraction of its time in a program. A GPU queues its
        calls (the host's dispatch overlaps them), so there each run is timed in a loop
        of its own, as :meth:`add` does.
        """
        if self._cuda and len(runs) > 1:
            for run in runs:
                self.add(run, repeats=repeats, min_us=min_us, max_inner=max_inner)
            return
        for run in runs:  # the first call pays for one-time set-up (allocations, plans)
            run()
        self.sync()
        inner = 1
        if min_us > 0 and max_inner > 1:
            start = time.perf_counter()
            for run in runs:
                run()
            self.sync()
            once = self.max_over_ranks([(time.perf_counter() - start) * 1e6])[0]
            inner = max(1, min(max_inner, math.ceil(min_us / max(once, 1e-3))))
        self._queued.append((tuple(runs), repeats, inner))

    def settle(self) -> list[float]:
        """The microseconds of every :meth:`add` (and each run of every
        :meth:`add_rotation`) since the last settle, in order: per repeat the slowest
        rank's time, median over the repeats.

        The queued entries take turns, one repeat each per round, so a burst of load
        from elsewhere on the machine slows one repeat of many, not every repeat of one.
        The slowest rank is found with one collective for all.
        """
        seconds: list[list[list[float]]] = [[[] for _ in r] for r, _, _ in self._queued]
        for round_ in range(max((n for _, n, _ in self._queued), default=0)):
            for i, (runs, repeats, inner) in enumerate(self._queued):
                if round_ >= repeats:
                    continue
                self.barrier()
                for mine, took in zip(seconds[i], self._repeat(runs, inner), strict=True):
                    mine.append(took)
        self._queued = []
        flat = [mine for entry in seconds for mine in entry]
        slowest = self.max_over_ranks([s for mine in flat for s in mine])
        out, at = [], 0
        for mine in flat:
            out.append(statistics.median(slowest[at : at + len(mine)]) * 1e6)
            at += len(mine)
        self.keeper.settle()
        return out

    def _repeat(self, runs: tuple[Callable[[], Any], ...], inner: int) -> list[float]:
        """Seconds per call of each of ``runs`` over one repeat of ``inner`` turns.

        On a CPU, each call is timed. A turn's time is the mean of the middle half of the
        turns: the ranks leave the barrier up to a few milliseconds apart, and in the first
        and last turns some of them run alone, faster than a step's ranks, which all run at
        once. The mean, not the median: ranks that share cores each run part of the time,
        and the waits for a core are part of a step's time. The turn's time is shared out
        over its runs in proportion to each run's median call, the call that had a core to
        itself: a wait begins at any instant, so it falls on a run in proportion to its
        length. A GPU queues its calls, so the repeat is timed whole.
        """
        start = time.perf_counter()
        if self._cuda or (inner < 8 and len(runs) == 1):
            for _ in range(inner):
                runs[0]()
            self.sync()
            return [(time.perf_counter() - start) / inner]
        marks = [start]
        for _ in range(inner):
            for run in runs:
                run()
                marks.append(time.perf_counter())
        return share_turns(np.diff(marks).reshape(inner, len(runs)))

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Each value's maximum over the job's ranks (float64)."""
        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        held = self.collective(_C10D.all_reduce)
        assert self._world is not None, "calibrate runs in a job with a default group"
        out = self.wait(held(local, "max", self._world.group_name))
        self.sync()
        return out.cpu().tolist()


def share_turns(calls: np.ndarray) -> list[float]:
    """Each run's share of a turn's time, from ``calls[turn, run]`` in seconds: the
    middle mean of the turns, split in proportion to the runs' median calls."""
    medians = np.median(calls, axis=0)
    turn = middle_mean(calls.sum(axis=1).tolist())
    return (turn * medians / medians.sum()).tolist()


def middle_mean(calls: list[float]) -> float:
    """The mean of the middle half of ``calls`` (in call order): the first and last
    quarters dropped, every call between counted, the slow ones too."""
    quarter = len(calls) // 4
    return statistics.fmean(calls[quarter : len(calls) - quarter])
