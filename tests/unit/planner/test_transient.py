"""The transient's re-solve and the time it may take: a budget counting activations
leaves room for the backward's transient peak, within the user's time limit
(autoplan.planner.transient, autoplan.planner.problem.SolveClock)."""

from __future__ import annotations

from autoplan.planner.problem import SolveClock


def test_a_solve_clock_counts_down_from_its_first_read():
    """No limit reads None; a limit reads what is left of it, less as time passes."""
    clock = SolveClock()
    assert clock.left(None) is None
    first = clock.left(10.0)
    assert 9.0 < first <= 10.0 and clock.left(10.0) <= first
