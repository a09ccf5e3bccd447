"""The transient's re-solve: a plan whose peak is over a budget that counts activations.

Input: the solve stage's :class:`~autoplan.planner.problem.PricedProblem` and the plan
:func:`~autoplan.planner.solve_mode.solve_mode` made. Output: that plan when its peak (what the
budget caps plus the backward's transient) fits, else the mode solved again with room
kept for the transient (on the ILP already built,
:meth:`~autoplan.ilp.formulation.build.IlpModel.with_budget`), or the first plan saying by
how much it is over. Why apart: the planner runs it once,
after the mode's first solve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from autoplan.core.config import PlanConfig
from autoplan.planner.problem import PricedProblem, Timer
from autoplan.planner.solve_mode import solve_mode
from autoplan.result.plan import Plan

__all__ = ["peak_bytes", "peak_fits", "reserve_transient"]


def reserve_transient(
    problem: PricedProblem,
    plan: Plan,
    mode: str | Mapping[str, str],
    base: dict[str, Any],
    timed: Timer,
    rounds: int = 2,
    *,
    reserve: float = 0.0,
) -> Plan:
    """``plan`` (solved with ``reserve`` bytes of the budget kept for the transient) when
    the budget does not count activations or its peak (the memory the budget caps plus
    the backward's transient peak) is within the budget. Otherwise its mode solved again
    with the budget less its transient, up to ``rounds`` times (another plan has another
    transient; with ``auto`` the ILP chooses the layers' modes again), until a plan's
    peak fits. When none does, ``plan``, its message saying by how much its peak is over."""
    if plan.status == "infeasible":
        return plan
    if peak_fits(plan, problem.config):
        return _kept(plan, reserve) if reserve else plan
    budget = problem.config.memory_budget_bytes
    assert budget is not None  # a peak that does not fit has a budget
    retry, timed_out = plan, False
    for _ in range(rounds):
        left = problem.clock.left(problem.config.time_limit_s)
        if left is not None and left <= 0:
            timed_out = True  # the user's limit bounds the plan, re-solves included
            break
        reserve = max(reserve, retry.memory_breakdown["transient"])
        retry = solve_mode(problem, mode, base, timed, reserve=reserve)
        if retry.status == "infeasible":
            break
        if peak_fits(retry, problem.config):
            return _kept(retry, reserve)
    over = (peak_bytes(plan) - budget) / 2**30
    return replace(
        plan,
        message=" ".join(
            filter(
                None,
                (
                    plan.message,
                    f"Its peak with the backward's transient, {peak_bytes(plan) / 2**30:.4g} GiB, "
                    f"is {over:.4g} GiB over memory_budget_gib: "
                    + (
                        f"plan.time_limit_s ({problem.config.time_limit_s} s) ran out before a "
                        "re-solve leaving room for the transient; raise it, or the budget a "
                        "little."
                        if timed_out
                        else "no plan found leaves room for the transient; raise the budget "
                        "a little or recompute more."
                    ),
                ),
            )
        ),
    )


def _kept(plan: Plan, reserve: float) -> Plan:
    """``plan``, its message saying how much of the budget its solve kept for the transient."""
    note = f"The budget kept {reserve / 2**20:.4g} MiB for the backward's transient peak"
    return replace(plan, message=" ".join(filter(None, (plan.message, note))))


def peak_fits(plan: Plan, config: PlanConfig) -> bool:
    """Whether ``plan``'s peak is within a budget that counts activations, or no such
    budget is set (the transient is checked only against one)."""
    budget = config.memory_budget_bytes
    return budget is None or not config.counts_activations or peak_bytes(plan) <= budget


def peak_bytes(plan: Plan) -> float:
    """What ``plan`` holds at the backward's peak: the budget's bytes and the transient."""
    return plan.memory_bytes + plan.memory_breakdown.get("transient", 0.0)
