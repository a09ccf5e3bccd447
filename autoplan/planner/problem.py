"""The priced problem every checkpointing mode's solve shares, and the clock they share.

Input: what :func:`~autoplan.planner.front_end.front_end` made (the rewritten graph, its
strategy table and cost table, the config, the constraint masks). Output: a
:class:`PricedProblem` that :mod:`autoplan.planner.solve_mode` solves per mode and
:mod:`autoplan.planner.transient` again under a smaller budget, keeping each mode's
reduced table and built ILP and ``auto``'s mode table for the re-solve; :class:`SolveClock`, the user's
time limit over all of one plan's solves.

Why apart: the front end makes it and the solve stages read it; neither imports the other.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoplan.core.config import PlanConfig
from autoplan.cost.price import CostTable
from autoplan.cost.shared_launch import SharedLaunch
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.reductions.followers import Reduction, collapse_followers
from autoplan.memory.layer_modes import ModeChoice, layer_modes, mode_boundary
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

__all__ = ["PricedProblem", "SolveClock", "Timer"]

Timer = Callable[[str], Callable[[], None]]  # phase -> a function ending it


class SolveClock:
    """The user's ``time_limit_s`` over all the solves of one plan (the first and the
    transient's re-solves): it bounds the plan, not each solve. Starts at the first read;
    the only clock the solve stage reads."""

    def __init__(self) -> None:
        self._start: float | None = None

    def left(self, limit_s: float | None) -> float | None:
        """Seconds left of ``limit_s`` (None: no limit); may be <= 0."""
        if limit_s is None:
            return None
        if self._start is None:
            self._start = time.perf_counter()
        return limit_s - (time.perf_counter() - self._start)


@dataclass(frozen=True)
class PricedProblem:
    """What every checkpointing mode's solve shares. ``allowed`` masks each constrained
    node's strategies; ``pinned`` names the pinned nodes (never tied to a twin)."""

    traced: TracedGraph
    table: StrategyTable
    costs: CostTable
    config: PlanConfig
    allowed: dict[str, np.ndarray]
    pinned: set[str]
    # the moves ``costs`` charges a share of their bucket's launch (None: none;
    # autoplan.planner.bucket_search)
    launch: SharedLaunch | None = None
    # each mode's solved ILP (with where its relaxation's ascent ended) and its tied
    # count, for a solve again under a smaller budget
    built: dict[Hashable, tuple[IlpModel, int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # each mode's recomputation and reduced table (autoplan.planner.solve_mode), for its
    # solves again under a smaller budget
    reductions: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)
    # the memory row's multiplier where the solve of the problem this one re-prices ended
    # (autoplan.planner.bucket_search; None: none), for its solves' ascents to try
    memory_price: float | None = None
    clock: SolveClock = field(default_factory=SolveClock, compare=False, repr=False)

    @functools.cached_property
    def mode_space(self) -> tuple[Reduction, ModeChoice]:
        """``auto``'s follower reduction and its table with each layer's modes
        (:mod:`autoplan.memory.layer_modes`), made once for its solve and the transient's."""
        keep = set(self.allowed) | mode_boundary(self.traced)
        reduction = (
            collapse_followers(self.table, self.costs, keep=keep)
            if self.config.collapse_followers
            else Reduction.unreduced(self.costs)
        )
        return reduction, layer_modes(self.traced, self.table, self.costs, reduction)
