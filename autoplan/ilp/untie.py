"""Stage 5c, untie: let the copies of a repeated layer differ where a memory budget pays for it.

Input: the cost table the tied ILP was built from, the tied model and its LP
relaxation (:func:`~autoplan.ilp.solve.relax`). Output: a plan for every node
that is never dearer than the best tied one, and how many tied classes it
splits (:func:`solve_untying` runs the whole solve stage in that order).

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
least ``LB + d[r,i] / copies`` (LB the tied bound, d its reduced cost, both from
:mod:`autoplan.ilp.relax`). First, :mod:`autoplan.ilp.mix` mixes the LP's
strategies layer by layer (a knapsack, in a fraction of a second); when that
plan is within 0.1 % of the tied bound, no MIP runs here (LLaMA3-70B native:
14 703.16 ms against a bound of 14 699.06 ms, where the MIP below had 14 708.5
ms after 10 s). Otherwise each weight (a node with a memory footprint) keeps
the strategies within the tied incumbent's gap by that measure; every other
node keeps the strategies the LP uses, plus the incumbent's own. The untied ILP
over those (one node per copy) starts from the better of the mix and the tied
incumbent, stops within 0.1 % of its own bound and is given as long as the
relaxation took, and at least 10 s; if its plan is still more than 0.1 % above
the tied bound, a second pass applies the reduced-cost test to every node. The
plan is priced exactly and kept only when cheaper.

Order: this runs between the tied relaxation and the tied MIP, and the untied
plan's cost is the MIP's cutoff. The MIP still proves that no tied plan is
cheaper than the plan returned (within a budget of its own: cut, the plan says
``time_limit``), but with an upper bound that close to the LP bound it keeps far
fewer columns: on LLaMA3-8B in native mode the solve stage
went from 3.2-3.4 s (tied MIP, then untie) to 2.3-2.7 s. Nothing is proved
about the untied optimum: on layers coupled only by the budget it is found
exactly (tests/test_untie.py); on LLaMA3-8B, einsum mode, 2 layers: 390.90 ->
390.41 ms, the untied optimum; 32 layers: 3137.4 -> 3122.1 ms, 0.013 % above
the LP bound.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.build import IlpModel, build_ilp
from autoplan.ilp.mix import mix_layers
from autoplan.ilp.problem import InfeasibleError
from autoplan.ilp.solve import Relaxation, Solution, relax, solve

_USED = 1e-6  # an LP value above this counts as "the LP uses this strategy"
_TIGHT = 1e-9  # margin on the gap, as a share of the objective, for the LP's tolerances
# Each pass stops within _CLOSE of its own bound. The second pass (every node) runs when
# the first pass's plan is more than _CLOSE above the tied LP bound. A pass runs only when
# it keeps at most _MAX_GROWTH[everywhere] times the strategies the tied ILP had in all:
# a larger untied ILP does not solve within the pass's time.
_CLOSE = 1e-3
_MAX_GROWTH = {False: 10, True: 4}
# The untied solve may take this many times the tied relaxation's seconds (at least _MIN_S).
# The relaxation takes well under two seconds even on LLaMA3-70B: with _MIN_S = 2 the second
# pass on the tiny LLaMA of tests/test_prune.py (4 layers, 2x2, binding budget, HiGHS,
# 134 503 columns) stopped with no plan and the result was 1124.07 us, 0.77 % above the
# untied optimum 1115.54 us that it finds in 5.7-6.3 s.
_TIME_SHARE = 1.0
_MIN_S = 10.0
# The tied MIP that then checks no tied plan beats the untied one gets this long, at least,
# or as long as the tied relaxation took when that is longer; cut, the plan is returned
# with status time_limit and its gap to the tied bound. It is worth little (it can only
# find a tied plan cheaper by at most that gap) and its time grows with the gap: on
# LLaMA3-70B native, untied plan 0.074 % above the tied bound, 1.9 s (71 s before CBC ran
# such proofs without preprocessing, cuts and presolve, see autoplan.ilp.backends), and
# 1.5-1.9 s at 0.031 %. 10 s leaves that proof room on a slower machine.
_PROOF_MIN_S = 10.0


def worth_untying(model: IlpModel, relaxed: Relaxation) -> bool:
    """Whether the tied plan could get cheaper untied: some class stands for several
    nodes, the LP relaxation has an incumbent and the memory budget binds it."""
    p = model.reduced
    if p.budget is None or not p.memory or relaxed.choice is None:
        return False
    if len(set(p.rep.values())) == len(p.rep):
        return False
    return relaxed.binds


def _narrow(
    model: IlpModel, relaxed: Relaxation, best: dict[str, int], gap: float, *, everywhere: bool
) -> dict[str, np.ndarray]:
    """Per node, the strategies a plan less than ``gap`` above the tied LP bound may use
    by the tied LP's reduced costs (every node when ``everywhere``, else weights only; the
    rest keep the LP's own), plus plan ``best``'s."""
    values, reduced = relaxed.lp_values or {}, relaxed.lp_reduced or {}
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
        mask[best[v]] = True
        narrowed[v] = mask
    return narrowed


@dataclass(frozen=True)
class Untied:
    """The untied ILP's best plan (a strategy per node), its cost and the seconds spent."""

    choice: dict[str, int]
    objective_us: float
    seconds: float


def untie_under_budget(
    costs: CostTable,
    model: IlpModel,
    relaxed: Relaxation,
    *,
    solver: str,
    time_limit_s: float | None,
    mip_gap: float,
) -> Untied:
    """The best plan the untied ILP near the tied LP's plan gives (see the module
    docstring), starting from the tied incumbent of ``relaxed``; never dearer than it."""
    assert relaxed.choice is not None, "worth_untying checks there is an incumbent"
    p = model.reduced
    seconds = max(_MIN_S, _TIME_SHARE * relaxed.seconds)
    if time_limit_s is not None:
        seconds = min(seconds, max(1.0, time_limit_s - relaxed.seconds))
    best = {v: relaxed.choice[r] for v, r in p.rep.items()}
    cost, spent = relaxed.upper, 0.0
    began = time.perf_counter()
    mixed = mix_layers(costs, model, relaxed)
    spent += time.perf_counter() - began
    if mixed is not None and mixed[1] < cost - _TIGHT * max(1.0, abs(cost)):
        best, cost = mixed  # cheaper by more than a float sum's order
    for everywhere in (False, True):
        gap = cost - relaxed.bound
        if gap <= _CLOSE * abs(cost):
            break  # the mix, or the first pass, is within _CLOSE of the tied bound
        gap += _TIGHT * max(1.0, abs(cost))
        narrowed = _narrow(model, relaxed, best, gap, everywhere=everywhere)
        if sum(int(m.sum()) for m in narrowed.values()) > _MAX_GROWTH[everywhere] * sum(
            int(np.isfinite(c).sum()) for c in p.linear.values()
        ):
            break
        try:
            untied = build_ilp(costs, allowed=narrowed, memory_budget_bytes=p.budget)
        except InfeasibleError:  # best's plan is in it, so this does not happen
            break
        found = solve(
            untied, solver=solver, time_limit_s=seconds, mip_gap=max(mip_gap, _CLOSE), start=best
        )
        spent += found.solve_seconds
        if found.choice and found.objective_us < cost:
            best, cost = found.choice, found.objective_us
    return Untied(best, cost, spent)


def solve_untying(
    costs: CostTable,
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    mip_gap: float = 0.0,
    fixing: bool = True,
    untie: bool = True,
) -> tuple[Solution, int]:
    """Solve the tied ``model``, untying first when :func:`worth_untying` (``untie``):
    the plan and the number of tied classes whose copies ended up on different strategies.

    The untied plan's cost is the tied MIP's cutoff, so the MIP only proves that no tied
    plan is cheaper, and with a cutoff that close to the LP bound most columns go. Its
    status and bound are the tied MIP's: ``optimal`` says no tied plan beats the plan
    returned (see the module docstring for what is known about untied ones). That MIP
    gets ``_PROOF_MIN_S`` or the relaxation's seconds, whichever is longer (less when
    ``time_limit_s`` leaves less); cut there, the untied plan comes back with status
    ``time_limit`` and its ``proof_budget_s`` set.
    """
    if not fixing:
        return solve(
            model, solver=solver, time_limit_s=time_limit_s, mip_gap=mip_gap, fixing=False
        ), 0
    relaxed = relax(model, solver=solver, time_limit_s=time_limit_s)
    untied = None
    left = time_limit_s
    budget = None  # the proof's own limit, when it is below the user's
    if untie and worth_untying(model, relaxed):
        untied = untie_under_budget(
            costs, model, relaxed, solver=solver, time_limit_s=time_limit_s, mip_gap=mip_gap
        )
        if left is not None:
            left = max(1.0, left - untied.seconds)
        proof = max(_PROOF_MIN_S, relaxed.seconds)
        if left is None or relaxed.seconds + proof < left:
            budget = proof  # solve counts the relaxation's seconds against its limit
            left = relaxed.seconds + proof
    tied = solve(
        model,
        solver=solver,
        time_limit_s=left,
        mip_gap=mip_gap,
        relaxed=relaxed,
        cutoff=untied.objective_us if untied is not None else math.inf,
    )
    tied = replace(tied, warm=relaxed.warm)  # every plan returned below is made from it
    if untied is None:
        return tied, 0
    seconds = tied.solve_seconds + untied.seconds
    cut = budget if tied.status == "time_limit" else None
    if not tied.choice or untied.objective_us >= tied.objective_us:
        return replace(tied, solve_seconds=seconds, proof_budget_s=cut), 0
    rep = model.reduced.rep
    split = {rep[v] for v, i in untied.choice.items() if i != untied.choice[rep[v]]}
    # The tied bound is no bound on the untied optimum: it is capped at the plan.
    merged = replace(
        tied,
        objective_us=untied.objective_us,
        choice=untied.choice,
        solve_seconds=seconds,
        bound_us=min(tied.bound_us, untied.objective_us),  # nan stays nan
        proof_budget_s=cut,
    )
    return merged, len(split)
