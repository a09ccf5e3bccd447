"""Stage 5e (solve), solve: run a MILP solver on the built ILP and read the choice back.

Input: an :class:`~autoplan.ilp.formulation.build.IlpModel`, usually with its
:class:`~autoplan.ilp.bound.relax.Relaxation`. Output: a :class:`Solution` (status,
objective, lower bound, the chosen strategy index of every node).

CBC ships inside PuLP, so planning needs no extra install; HiGHS
(``highspy``) is used when asked for and installed. Both get the same arrays
(:mod:`autoplan.ilp.backends`).

Reduced-cost fixing (``fixing=True``), exact: first a lower bound ``LB`` and,
per column j, a price ``d_j`` such that every plan using column j costs at
least ``LB + d_j`` (:mod:`autoplan.ilp.bound.dual`, by dual ascent on the problem's
structure), and a feasible plan of cost ``UB`` (decoded from the bound, or
rounded from an LP, :mod:`autoplan.ilp.bound.incumbent`); then the MIP with that
plan as warm start and every column with ``d_j > UB - LB`` left out. No plan
cheaper than the incumbent is cut off, and the incumbent itself stays. Why: the
memory row makes the LP fractional and the branch and bound long, and the fixing
drops most of the columns and of the tree.

The relaxation is a step of its own (:func:`~autoplan.ilp.bound.relax.relax`, then
``solve(relaxed=...)``) so that the untie step (:mod:`autoplan.ilp.untying.untie`) can
run between the two and hand the MIP a ``cutoff``: a plan known to cost that much
replaces UB in the test above when it is lower
(:func:`~autoplan.ilp.solver.stage.solve_ilp` runs them in that order).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from autoplan.ilp.backends import check_solver, run
from autoplan.ilp.bound.relax import Relaxation, class_values, relax, start_vector, valid_cost
from autoplan.ilp.formulation.build import IlpModel, Warm
from autoplan.ilp.tolerances import GAP_NOISE, LP_NONZERO

__all__ = ["Solution", "solve"]


@dataclass(frozen=True)
class Solution:
    """What the solver found. ``choice`` is empty unless a solution exists: with status
    ``infeasible`` none does, with ``time_limit`` the solver stopped before it found one.

    ``bound_us`` is a proven lower bound on the optimum (nan when unknown);
    ``stats`` says what the reduced-cost fixing did. ``proof_budget_s`` is set when the
    status is ``time_limit`` because the check that no tied plan beats an untied one
    stopped at its own budget, not at the user's limit
    (:func:`~autoplan.ilp.solver.stage.solve_ilp`).
    """

    status: str  # "optimal" | "time_limit" | "infeasible"
    objective_us: float
    choice: dict[str, int]
    solve_seconds: float
    solver: str
    bound_us: float = math.nan
    stats: dict[str, float] | None = None
    proof_budget_s: float | None = None
    warm: Warm | None = None  # where the relaxation's dual ascent ended (IlpModel.with_budget)

    @property
    def gap(self) -> float:
        """Relative gap between the plan and the bound (nan when unknown); an optimal
        solve's bound is its cost less the ``mip_gap`` it was allowed."""
        if not math.isfinite(self.bound_us) or not self.objective_us:
            return math.nan
        return max(0.0, (self.objective_us - self.bound_us) / abs(self.objective_us))


# The restricted MIP of _polish keeps columns whose price is within this share of the
# incumbent's gap to the bound.
_POLISH_SHARE = 0.05


def _polish(
    model: IlpModel, solver: str, pre: Relaxation, time_limit_s: float | None
) -> Relaxation:
    """``pre`` with a better incumbent from a MIP over the nearly-free columns, when they
    are few.

    The first plan can sit well above the optimum under a memory budget, and the fixing
    is only as strong as the incumbent is good. The columns the LP uses or the bound
    prices within a small share of the gap hold the optimum or a plan near it, and their
    MIP is quick; its plan (checked and priced exactly) replaces the incumbent when
    cheaper, which makes the final MIP's fixing stronger. Nothing is proved here: the
    final MIP does that.
    """
    if pre.choice is None or pre.x is None or pre.dj is None or pre.start is None:
        return pre
    began = time.perf_counter()
    upper, start = pre.upper, pre.start
    keep = (pre.dj <= _POLISH_SHARE * (upper - pre.bound)) | (pre.x > LP_NONZERO) | (start > 0.0)
    if upper - pre.bound <= GAP_NOISE * max(1.0, abs(upper)) or keep.mean() > 0.5:
        return pre
    result = run(
        model.emitted.matrix.columns(keep),
        solver,
        mip=True,
        time_limit_s=time_limit_s,
        mip_gap=0.0,
        start=start[keep],
    )
    seconds = pre.seconds + time.perf_counter() - began
    if result.x is None:
        return replace(pre, seconds=seconds)
    full = np.zeros(len(keep))
    full[keep] = result.x
    found = _read_choice(model, full)
    cost = valid_cost(model, found)
    if cost >= upper:
        return replace(pre, seconds=seconds)
    stats = dict(pre.stats or {}) | {"incumbent_us": cost}
    start = start_vector(model, found)
    return replace(pre, choice=found, start=start, stats=stats, seconds=seconds)


def _read_choice(model: IlpModel, x: np.ndarray) -> dict[str, int]:
    """Each class's strategy in solution ``x``: the allowed one with the largest value."""
    values = class_values(model, x)
    return {
        r: int(np.argmax(np.where(np.isfinite(c), values[r], -1.0)))
        for r, c in model.reduced.linear.items()
    }


def solve(
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    mip_gap: float = 0.0,
    fixing: bool = True,
    start: Mapping[str, int] | None = None,
    relaxed: Relaxation | None = None,
    cutoff: float = math.inf,
) -> Solution:
    """Solve ``model``; nodes with a single allowed strategy need no variable.

    With ``fixing``, the MIP runs after :func:`relax` (or on ``relaxed``, its result
    computed before; its seconds count in the solution's). ``start`` (a strategy per
    class, e.g. a plan of a more constrained model) is used as the incumbent when it is
    valid and cheaper than the LP-rounded one (by :func:`relax`, so not with ``relaxed``).
    ``cutoff`` is the cost of a plan known from elsewhere (an untied one,
    :mod:`autoplan.ilp.untying.untie`): the MIP then only looks for plans cheaper than it,
    and the plan returned may cost more than ``cutoff`` (the incumbent, when no cheaper
    plan exists).

    The plan returned is checked, not trusted: its cost is recomputed from the
    reduced problem, and a solver that stops early with no valid plan (CBC
    can write its LP solution when stopped on time) falls back to the LP-rounded
    incumbent, reported as ``time_limit``.
    """
    check_solver(solver)
    start_time = time.perf_counter()
    if model.infeasible:
        return Solution("infeasible", float("nan"), {}, 0.0, solver)
    em, p = model.emitted, model.reduced
    m = em.matrix
    pre = Relaxation()
    status = "optimal"
    choice = {r: em.fixed.get(r, 0) for r in p.linear}
    before = relaxed.seconds if relaxed is not None else 0.0  # spent before this call

    def left() -> float | None:
        """What is left of ``time_limit_s``, at least a second (None: no limit)."""
        if time_limit_s is None:
            return None
        return max(1.0, time_limit_s - before - (time.perf_counter() - start_time))

    if fixing and m.num_cols:
        if relaxed is None:
            relaxed = relax(model, solver=solver, time_limit_s=time_limit_s, start=start)
        pre = relaxed
        if cutoff >= pre.upper:  # a better incumbent still makes the fixing stronger
            pre = _polish(model, solver, pre, left())
    bound, stats, incumbent = pre.bound, dict(pre.stats or {}), pre.choice
    if m.num_cols:
        keep, x0 = pre.keep(cutoff), pre.start
        if keep is not None:
            stats["fixed"] = float((~keep).sum())
        # Fixed columns are left out of the MIP altogether: a smaller model to write and presolve.
        sub = m.columns(keep) if keep is not None else m
        if keep is not None and x0 is not None:
            x0 = x0[keep]
        # A cutoff below the incumbent goes to the solver too: it prunes every node that
        # cannot beat it, and "infeasible" then proves that no plan does.
        limit = cutoff if incumbent is not None and cutoff < pre.upper else None
        result = run(
            sub, solver, mip=True, time_limit_s=left(), mip_gap=mip_gap, start=x0, cutoff=limit
        )
        if math.isfinite(result.bound):
            bound = max(bound, result.bound) if math.isfinite(bound) else result.bound
        # The cheaper valid plan of the solver's answer and the incumbent it started from;
        # each is priced once, exactly (the incumbent's price is the relaxation's).
        found, cost = None, math.inf
        if result.x is not None:
            x = np.zeros(m.num_cols)
            x[keep if keep is not None else slice(None)] = result.x
            found = _read_choice(model, x)
            cost = valid_cost(model, found)
            status = "optimal" if result.status == "optimal" else "time_limit"
        # Searched to the end under a cutoff: no plan is cheaper than the cutoff but the
        # one found (CBC says "infeasible" when there is none), so that is a bound, up
        # to the relative gap the solver was allowed.
        proved = False
        if limit is not None and result.status in ("optimal", "infeasible"):
            proved, floor = True, min(cost, limit) * (1.0 - mip_gap)
            bound = max(bound, floor) if math.isfinite(bound) else floor
        if incumbent is not None and pre.upper < cost:
            if not math.isfinite(cost) and not proved:  # the solver gave no valid plan
                status = "time_limit"
            found, cost = incumbent, pre.upper
        if not math.isfinite(cost):
            seconds = before + time.perf_counter() - start_time
            # no plan: proved, or the solver stopped on time before it found one
            status = "infeasible" if result.status == "infeasible" else "time_limit"
            return Solution(status, float("nan"), {}, seconds, solver, bound, stats=stats)
        choice = found
    else:
        cost = valid_cost(model, choice)
    if status == "optimal":  # proved, up to the relative gap the solver was allowed
        floor = cost * (1.0 - mip_gap)
        bound = min(cost, max(bound, floor)) if math.isfinite(bound) else floor
    nodes = {v: choice[r] for v, r in p.rep.items()}
    seconds = before + time.perf_counter() - start_time
    return Solution(status, cost, nodes, seconds, solver, bound, stats)
