"""The solve stage's messages: how a solve ended, and why no plan fits a budget.

Input: a solver's :class:`~autoplan.ilp.solver.solve.Solution`, or the smallest footprint a
budget is below. Output: the text a :class:`~autoplan.result.plan.Plan` carries, naming the
setting and the lever that would help. Why apart: :mod:`autoplan.planner.solve_mode`
sequences the solve; these say what it found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from autoplan.core.config import PlanConfig
from autoplan.cost.price import CostTable
from autoplan.ilp.solver.solve import Solution
from autoplan.result.plan import Plan

__all__ = ["infeasible", "min_memory", "status_message", "too_small"]


def status_message(solution: Solution, split: int, config: PlanConfig) -> str:
    """What the plan's message says of how the solve ended (empty when proved optimal)."""
    gap = solution.gap
    within = f"; it is at most {gap:.3%} above any tied plan" if math.isfinite(gap) else ""
    skipped = int((solution.stats or {}).get("skipped_columns", 0))
    if solution.status == "node_limit" and solution.proof_nodes == 0 and skipped:
        return (
            "node_limit: after the untie stage (layers under the memory budget), the MIP "
            f"over tied plans was not run: at {skipped} columns even its first nodes are "
            f"past the proof's limit of work{within}. Set plan.untie_under_budget: false "
            "to solve the tied ILP alone, within plan.time_limit_s."
        )
    if solution.status == "node_limit" and solution.proof_nodes is not None:
        return (
            "node_limit: after the untie stage (layers under the memory budget), the MIP "
            f"over tied plans stopped at its limit of {solution.proof_nodes} branch-and-bound "
            f"nodes before proving that none beats this plan{within}. Set "
            "plan.untie_under_budget: false to solve the tied ILP alone, within "
            "plan.time_limit_s."
        )
    if solution.status == "node_limit":
        return (
            "node_limit: the solver stopped at its node limit before proving this plan optimal"
            + (f"; it is at most {gap:.2%} above the optimum" if math.isfinite(gap) else "")
            + ". Accept a gap with plan.mip_gap."
        )
    if solution.status == "optimal" and split:
        return (
            f"optimal among tied plans: {split} twin class{'es are' if split > 1 else ' is'} "
            "split under the memory budget (plan.untie_under_budget), and the MIP over tied "
            "plans proved that none beats this plan; other splits were searched, not proved. "
            "Set plan.untie_under_budget: false for the tied optimum alone."
        )
    if solution.status == "time_limit":
        return (
            f"time_limit: the solve reached time_limit_s ({config.time_limit_s} s) before "
            "proving this plan optimal"
            + (f"; it is at most {gap:.2%} above the optimum" if math.isfinite(gap) else "")
            + " (a plan cut short by the clock may differ from run to run). Raise "
            "plan.time_limit_s, or accept a gap with plan.mip_gap."
        )
    return ""


def min_memory(costs: CostTable, allowed: dict[str, np.ndarray]) -> float:
    """The smallest footprint any plan has: each node's least memory among its allowed."""
    total = 0.0
    for p, mem in costs.memory.items():
        ok = allowed.get(p, np.ones(len(mem), dtype=bool))
        total += float(mem[ok].min())
    return total


def too_small(
    config: PlanConfig,
    params: Sequence[str],
    allowed: dict[str, np.ndarray],
    mode: str,
    costs: CostTable,
    need: float,
    reserve: float,
) -> str:
    """The infeasible message: the smallest footprint, its parts, and the levers left."""
    states = min_memory(
        replace(costs, memory={p: costs.memory[p] for p in params if p in costs.memory}),
        allowed,
    )
    budget = config.memory_budget_bytes
    assert budget is not None, "only a memory budget makes a plan infeasible by memory"
    levers = ["raise the budget", "use a larger mesh"]
    held = f" and {reserve / 2**30:.4g} GiB for the backward's transient peak" if reserve else ""
    parts = "parameters + gradients + optimizer state"
    if config.counts_activations:
        parts += (
            f" ({states / 2**30:.4g} GiB) + saved activations ({(need - states) / 2**30:.4g} GiB)"
        )
        if mode not in ("full", "auto"):  # auto's smallest footprint recomputes in full
            levers.append("recompute more (activation_checkpointing: full)")
        levers.append("shorten the sequence or the batch")
    return (
        f"infeasible: memory_budget_gib ({config.memory_budget_gib}) is below the smallest "
        f"footprint any plan has on this mesh, {need / 2**30:.6g} GiB ({need:.0f} bytes) of "
        f"{parts} per device{held}, {(need + reserve - budget) / 2**30:.4g} "
        f"GiB over (checkpointing: {mode}"
        + (", any mode per layer" if mode == "auto" else "")
        + f"); {', '.join(levers[:-1])} or {levers[-1]}."
    )


def infeasible(message: str, base: dict[str, Any]) -> Plan:
    """An infeasible plan with ``message`` and the fields of ``base``."""
    return Plan(
        status="infeasible",
        objective_us=math.nan,
        compute_us=math.nan,
        comm_us=math.nan,
        message=message,
        **base,
    )
