"""The transient's re-solve and the time it may take: a budget counting activations
leaves room for the backward's transient peak, within the user's time limit
(autoplan.planner.transient, autoplan.planner.problem.SolveClock)."""

from __future__ import annotations

from types import SimpleNamespace

import autoplan
from autoplan.planner.front_end import untimed
from autoplan.planner.problem import SolveClock
from autoplan.planner.transient import reserve_transient
from tests.helpers.planning import plan_tiny_llama


def test_a_solve_clock_counts_down_from_its_first_read():
    """No limit reads None; a limit reads what is left of it, less as time passes."""
    clock = SolveClock()
    assert clock.left(None) is None
    first = clock.left(10.0)
    assert 9.0 < first <= 10.0 and clock.left(10.0) <= first


def test_a_plan_solved_with_room_kept_says_so_when_it_fits():
    """A plan its solve kept room for the transient (the bucket search's) and that fits is
    returned as it is, its message saying how much was kept; with no room kept, unchanged."""
    plan = plan_tiny_llama(
        autoplan.fake_mesh((2,), ("dp",)), input_placements="S(0)", config=autoplan.PlanConfig()
    )
    config = autoplan.PlanConfig(memory_budget_gib=100.0, activation_memory=True)
    problem = SimpleNamespace(config=config, clock=SolveClock())
    kept = reserve_transient(problem, plan, "none", {}, untimed, reserve=5 * 2**20)  # type: ignore[arg-type]
    assert kept.message.endswith("The budget kept 5 MiB for the backward's transient peak")
    assert kept.param_placements == plan.param_placements
    assert reserve_transient(problem, plan, "none", {}, untimed) is plan  # type: ignore[arg-type]
