"""Stage 5d (untying), untie: let a repeated layer's copies differ where a memory budget pays.

Input: the cost table the tied ILP was built from, the tied model and its relaxation
(:func:`~autoplan.ilp.bound.relax.relax`). Output: an :class:`Untied` plan for every
node, never dearer than the tied incumbent (:func:`untie_under_budget`);
:func:`worth_untying` says when to look for one.

Why: tying (:mod:`autoplan.ilp.reductions.tying`) gives every copy of a repeated layer
one strategy. Without a budget, identical layers want the same strategy anyway; under
a binding memory budget they may not: the best plan can keep the big, fast placement
of a weight in some layers and shard it in others, a knapsack mix no tied class can
express.

How: the tied LP relaxation says where to look. When the copies are exact twins, its
solution copied to every copy is optimal for the untied LP too and its duals split
evenly over the copies, so a plan whose copy takes strategy i of class r costs at
least ``LB + d[r,i] / copies`` (LB the tied bound, d its reduced cost, both from
:mod:`autoplan.ilp.bound.relax`). First, :mod:`autoplan.ilp.untying.mix` mixes the LP's
strategies layer by layer (a knapsack, quick); when that plan is within ``_CLOSE`` of
the tied bound, no MIP runs here. Otherwise each weight (a node with a memory
footprint) keeps the strategies within the tied incumbent's gap by that measure;
every other node keeps the strategies the LP uses, plus the incumbent's own. The
untied ILP over those (one node per copy) starts from the better of the mix and the
tied incumbent, stops within ``_CLOSE`` of its own bound or at ``_PASS_NODES``
branch-and-bound nodes, fewer on a large ILP (``_PASS_WORK``; limits of work: the same
plan on any machine); if its plan is
still more than ``_CLOSE`` above the tied bound, a second pass applies the reduced-cost
test to every node. The plan is priced exactly and kept only when cheaper.

Nothing is proved about the untied optimum: on layers coupled only by the budget it
is found exactly (tests/integration/test_untie.py); elsewhere it is the best plan found near the
LP's. :func:`~autoplan.ilp.solver.stage.solve_ilp` runs this between the tied
relaxation and the tied MIP, whose cutoff is the untied plan's cost.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.bound.relax import Relaxation
from autoplan.ilp.formulation.build import IlpModel, build_ilp
from autoplan.ilp.formulation.problem import InfeasibleError
from autoplan.ilp.solver.solve import solve
from autoplan.ilp.tolerances import ASCENT_CONVERGED_SEARCH, LP_USED, ROUNDING_RTOL
from autoplan.ilp.untying.mix import mix_layers

# Each pass stops within _CLOSE of its own bound. The second pass (every node) runs when
# the first pass's plan is more than _CLOSE above the tied LP bound. A pass runs only when
# it keeps at most _MAX_GROWTH[everywhere] times the strategies the tied ILP had in all:
# a larger untied ILP does not solve within the pass's node limit.
_CLOSE = 1e-3
_MAX_GROWTH = {False: 10, True: 4}
# Each pass's MIP stops after this many branch-and-bound nodes (a large one after
# _PASS_WORK column-nodes, solve.node_limit), and its branching on checkpointing modes
# after this many MIPs: it searches, it proves nothing, and the tied MIP after it checks
# the plan it gives.
_PASS_NODES = 200
_PASS_WORK = 1_500_000
_PASS_LEAVES = 8


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
            mask = ok & ((values[r] > LP_USED) | (reduced[r] / copies[r] <= gap))
        else:
            mask = ok & (values[r] > LP_USED)
        mask[best[v]] = True
        narrowed[v] = mask
    return narrowed


@dataclass(frozen=True)
class Untied:
    """The untied ILP's best plan (a strategy per node), its cost, the seconds spent and
    whether the time limit cut a pass short (then another run may find another plan)."""

    choice: dict[str, int]
    objective_us: float
    seconds: float
    out_of_time: bool = False


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
    best = {v: relaxed.choice[r] for v, r in p.rep.items()}
    cost, spent, out_of_time = relaxed.upper, 0.0, False
    began = time.perf_counter()
    mixed = mix_layers(costs, model, relaxed)
    spent += time.perf_counter() - began
    if mixed is not None and mixed[1] < cost - ROUNDING_RTOL * max(1.0, abs(cost)):
        best, cost = mixed  # cheaper by more than a float sum's order
    # With checkpointing modes in the ILP the first pass is left out: it holds every node
    # but the weights at the LP's strategies, and splitting a layer group's mode needs others.
    for everywhere in (True,) if p.blocks else (False, True):
        gap = cost - relaxed.bound
        if gap <= _CLOSE * abs(cost):
            break  # the mix, or the first pass, is within _CLOSE of the tied bound
        gap += ROUNDING_RTOL * max(1.0, abs(cost))
        narrowed = _narrow(model, relaxed, best, gap, everywhere=everywhere)
        if sum(int(m.sum()) for m in narrowed.values()) > _MAX_GROWTH[everywhere] * sum(
            int(np.isfinite(c).sum()) for c in p.linear.values()
        ):
            break
        try:
            untied = build_ilp(costs, allowed=narrowed, memory_budget_bytes=p.budget)
        except InfeasibleError:  # best's plan is in it, so this does not happen
            break
        left = None
        if time_limit_s is not None:
            left = max(1.0, time_limit_s - relaxed.seconds - spent)
        found = solve(
            untied,
            solver=solver,
            time_limit_s=left,
            mip_gap=max(mip_gap, _CLOSE),
            start=best,
            max_nodes=_PASS_NODES,
            node_work=_PASS_WORK,
            max_leaves=_PASS_LEAVES,
            settle=ASCENT_CONVERGED_SEARCH,  # its prices only steer a search
            seed=(relaxed.dual, p) if relaxed.dual is not None else None,
        )
        spent += found.solve_seconds
        out_of_time |= found.status == "time_limit"
        if found.choice and found.objective_us < cost:
            best, cost = found.choice, found.objective_us
    return Untied(best, cost, spent, out_of_time)
