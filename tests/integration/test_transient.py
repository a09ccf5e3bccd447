"""The transient's re-solve and the time it may take: a budget counting activations
leaves room for the backward's transient peak, within the user's time limit
(autoplan.planner.transient, autoplan.planner.problem.SolveClock)."""

from __future__ import annotations

import autoplan
from autoplan.planner import solve_mode as solve_stage
from autoplan.planner.problem import SolveClock
from tests.helpers.planning import plan_tiny_llama

COUNTED = ("parameters", "gradients", "optimizer", "activations", "output_grad")


def _plan(**config) -> autoplan.Plan:
    return plan_tiny_llama(
        autoplan.fake_mesh((4,), ("dp",)),
        batch=8,
        seq=32,
        input_placements="S(0)",
        config=autoplan.PlanConfig(**config),
    )


def test_the_time_limit_bounds_the_plan_with_its_transient_re_solves(monkeypatch):
    """plan.time_limit_s covers the first solve and the transient's re-solves together:
    with no time left after the first, none runs (nor a bucket search's), and the plan says its peak is over and
    that the limit ran out (each solve had the whole limit, so a budgeted plan took two or
    three times it)."""
    free = _plan()
    budget = 0.7 * sum(free.memory_breakdown[k] for k in COUNTED) / 2**30
    solves = []
    solve = solve_stage.solve_ilp
    monkeypatch.setattr(
        solve_stage, "solve_ilp", lambda *a, **k: solves.append(1) or solve(*a, **k)
    )
    reads = []

    def left(self, limit_s):  # the whole limit at the first solve, none after it
        reads.append(limit_s)
        return limit_s if len(reads) == 1 else 0.0

    monkeypatch.setattr(SolveClock, "left", left)
    plan = _plan(memory_budget_gib=budget, activation_memory=True, time_limit_s=60.0)
    # read by the first solve and the transient's re-solve (and a bucket search, when the
    # plan's buckets are worth one): one solve
    assert len(solves) == 1 and reads[:2] == [60.0, 60.0] and len(reads) <= 3
    assert "ran out before a re-solve" in plan.message and "time_limit_s (60.0 s)" in plan.message
