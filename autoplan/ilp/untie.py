"""Stage 5c, untie: let the copies of a repeated layer differ where a memory budget pays for it.

Input: the cost table the tied ILP was built from, the tied model and its
solution. Output: a plan for every node that is never dearer than the tied
one, and how many tied classes it splits.

Why: tying (:mod:`autoplan.ilp.cluster`) gives every copy of a repeated layer
one strategy. Without a budget, identical layers want the same strategy
anyway; under a binding memory budget they may not: the best plan can keep
the big, fast placement of a weight in some layers and shard it in others, a
knapsack mix no tied class can express. Measured on the tied optimum before
this stage: LLaMA3-8B under its 4 GiB budget, 2 layers, 0.126 % above the
untied optimum; 32 layers under 40 GiB, 0.49 % above a plan this stage finds.

How: the tied LP relaxation says where to look. When the copies are exact
twins, its solution copied to every copy is optimal for the untied LP too
(the bounds agree on LLaMA3-8B at 2 and 32 layers) and its duals split evenly
over the copies, so a plan whose copy takes strategy i of class r costs at
least ``LB + d[r,i] / copies`` (LB the LP bound, d the tied reduced cost). Each
weight (a node with a memory footprint) keeps the strategies within the tied
plan's gap by that measure; every other node keeps the strategies the LP uses,
plus the tied plan's own. The untied ILP over those (one node per copy) starts
from the tied plan, stops within 0.1 % of its own bound and is given at most
about as long as the tied solve took; if its plan is still more than 0.1 %
above the tied LP bound, a second pass applies the reduced-cost test to every
node. The plan is priced exactly and kept only when cheaper. Nothing is proved about the
untied optimum: on layers coupled only by the budget it is found exactly
(tests/test_untie.py); on LLaMA3-8B it takes 0.03 s at 2 layers (390.90 ->
390.41 ms, the untied optimum) and 0.8 s at 32 layers (3137.4 -> 3122.1 ms,
0.013 % above the LP bound).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.build import IlpModel, build_ilp
from autoplan.ilp.problem import InfeasibleError
from autoplan.ilp.solve import Solution, solve

_USED = 1e-6  # an LP value above this counts as "the LP uses this strategy"
_TIGHT = 1e-9  # margin on the gap, as a share of the objective, for the LP's tolerances
# Each pass stops within _CLOSE of its own bound. The second pass (every node) runs when
# the first pass's plan is more than _CLOSE above the tied LP bound, and keeps at most
# _MAX_GROWTH times the strategies the tied ILP had in all.
_CLOSE = 1e-3
_MAX_GROWTH = 4
_SLACK = 1e-6  # the LP's memory row binds when it uses all but this share of the budget
# The untied solve may take this many times the tied solve's seconds (at least _MIN_S).
_TIME_SHARE = 1.0
_MIN_S = 2.0


def worth_untying(model: IlpModel, solution: Solution) -> bool:
    """Whether the tied ``solution`` could get cheaper untied: some class stands for
    several nodes and the memory budget binds the LP relaxation (which is at hand)."""
    p, values = model.reduced, solution.lp_values
    if p.budget is None or not p.memory or values is None or not solution.choice:
        return False
    if len(set(p.rep.values())) == len(p.rep):
        return False
    used = sum(float(np.dot(m, values[r])) for r, m in p.memory.items() if r in values)
    return used >= p.budget * (1 - _SLACK)


def _narrow(
    model: IlpModel, solution: Solution, best: Solution, gap: float, *, everywhere: bool
) -> dict[str, np.ndarray]:
    """Per node, the strategies a plan less than ``gap`` above the tied LP bound may use
    by the tied LP's reduced costs (every node when ``everywhere``, else weights only; the
    rest keep the LP's own), plus ``best``'s."""
    values, reduced = solution.lp_values or {}, solution.lp_reduced or {}
    p = model.reduced
    copies = Counter(p.rep.values())
    narrowed = {}  # within model.allowed, so the user's constraints still hold
    for v, ok in model.allowed.items():
        r = p.rep[v]
        if r not in values:
            mask = ok.copy()
        elif everywhere or r in p.memory:
            mask = ok & ((values[r] > _USED) | (reduced[r] / copies[r] <= gap))
        else:
            mask = ok & (values[r] > _USED)
        mask[best.choice[v]] = True
        narrowed[v] = mask
    return narrowed


def untie_under_budget(
    costs: CostTable,
    model: IlpModel,
    solution: Solution,
    *,
    solver: str,
    time_limit_s: float | None,
    mip_gap: float,
) -> tuple[Solution, int]:
    """The cheaper of ``solution`` and the untied ILP's plan near it, and the number of
    tied classes whose copies ended up on different strategies."""
    p = model.reduced
    seconds = max(_MIN_S, _TIME_SHARE * solution.solve_seconds)
    if time_limit_s is not None:
        seconds = min(seconds, max(1.0, time_limit_s - solution.solve_seconds))
    bound = (solution.stats or {}).get("lp_bound_us", -math.inf)
    best, spent = solution, 0.0
    for everywhere in (False, True):
        gap = best.objective_us - bound
        if everywhere and gap <= _CLOSE * abs(best.objective_us):
            break
        gap += _TIGHT * max(1.0, abs(best.objective_us))
        narrowed = _narrow(model, solution, best, gap, everywhere=everywhere)
        if everywhere and sum(int(m.sum()) for m in narrowed.values()) > _MAX_GROWTH * sum(
            int(np.isfinite(c).sum()) for c in p.linear.values()
        ):
            break
        try:
            untied = build_ilp(costs, allowed=narrowed, memory_budget_bytes=p.budget)
        except InfeasibleError:  # best's plan is in it, so this does not happen
            break
        found = solve(
            untied,
            solver=solver,
            time_limit_s=seconds,
            mip_gap=max(mip_gap, _CLOSE),
            start=best.choice,
        )
        spent += found.solve_seconds
        if found.choice and found.objective_us < best.objective_us:
            best = found
    if best is solution:
        return solution, 0
    split = {p.rep[v] for v, i in best.choice.items() if i != best.choice[p.rep[v]]}
    # The tied LP bound is no bound on the untied optimum: it is capped at the plan.
    merged = replace(
        solution,
        objective_us=best.objective_us,
        choice=best.choice,
        solve_seconds=solution.solve_seconds + spent,
        bound_us=min(solution.bound_us, best.objective_us),  # nan stays nan
    )
    return merged, len(split)
