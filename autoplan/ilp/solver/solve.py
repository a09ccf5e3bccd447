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
(:func:`~autoplan.ilp.solver.stage.solve_ilp` runs them in that order). With
checkpointing modes chosen per layer, the MIP runs under a branching on the modes
(:mod:`autoplan.ilp.solver.modes`), each branch with its own relaxation and fixing.

Nothing here reads the clock but to honour the user's ``time_limit_s``: the MIP stops on
its own, or at ``max_nodes`` branch-and-bound nodes (a limit of work, the same on any
machine), and a plan any step of which the time limit cut short says ``time_limit``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from autoplan.ilp.backends import SolverCrashed, check_solver, run
from autoplan.ilp.bound.dual import Dual
from autoplan.ilp.bound.relax import Relaxation, class_values, relax, start_vector, valid_cost
from autoplan.ilp.formulation.build import IlpModel, Warm
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.solver.modes import Outcome, branch_modes, mode_groups
from autoplan.ilp.tolerances import ASCENT_CONVERGED_REFINE, GAP_NOISE, LP_NONZERO

__all__ = ["Solution", "solve"]


@dataclass(frozen=True)
class Solution:
    """What the solver found. ``choice`` is empty unless a solution exists: with status
    ``infeasible`` none does, with ``time_limit`` the solver stopped before it found one.

    ``status`` is "optimal" (searched to the end, up to ``mip_gap``), "infeasible",
    "time_limit" (the user's time limit cut a step short: another run may differ) or
    "node_limit" (a MIP stopped at its node limit: the same on every run).
    ``bound_us`` is a proven lower bound on the optimum (nan when unknown);
    ``stats`` says what the reduced-cost fixing did. ``proof_nodes`` is set when the
    status is ``node_limit`` because the check that no tied plan beats an untied one
    stopped at that many nodes (:func:`~autoplan.ilp.solver.stage.solve_ilp`).
    """

    status: str  # "optimal" | "time_limit" | "node_limit" | "infeasible"
    objective_us: float
    choice: dict[str, int]
    solve_seconds: float
    solver: str
    bound_us: float = math.nan
    stats: dict[str, float] | None = None
    proof_nodes: int | None = None
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
# ... and stops after this many branch-and-bound nodes: it only looks for a better
# incumbent, which the final MIP does not need.
_POLISH_NODES = 1000
# A node limit given with a work (column-nodes) never drops below this many nodes.
_MIN_NODES = 10


def node_limit(max_nodes: int | None, columns: int, work: int | None = None) -> int | None:
    """The nodes a MIP of ``columns`` columns may take under a limit of ``max_nodes``
    (None: no limit) and, when ``work`` is given, of ``work`` column-nodes (its columns
    times its nodes), never under :data:`_MIN_NODES`: a node re-solves an LP over every
    column, so a fixed count of nodes is minutes on a MIP of 100 k columns. A count, the
    same on any machine. 0: not run at all, as even its floor of nodes is past the work
    (the root of a MIP that size, a million columns, can take longer than any node limit
    would allow)."""
    if max_nodes is None or work is None:
        return max_nodes
    nodes = min(max_nodes, max(_MIN_NODES, work // max(columns, 1)))
    return 0 if columns * nodes > work else nodes


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
    final MIP does that, so a solver that crashes on this MIP costs only the search, and
    the stats say ``polish_crashed``.
    """
    if pre.choice is None or pre.x is None or pre.dj is None or pre.start is None:
        return pre
    began = time.perf_counter()
    upper, start = pre.upper, pre.start
    keep = (pre.dj <= _POLISH_SHARE * (upper - pre.bound)) | (pre.x > LP_NONZERO) | (start > 0.0)
    if upper - pre.bound <= GAP_NOISE * max(1.0, abs(upper)) or keep.mean() > 0.5:
        return pre
    try:
        result = run(
            model.emitted.matrix.columns(keep),
            solver,
            mip=True,
            time_limit_s=time_limit_s,
            mip_gap=0.0,
            start=start[keep],
            max_nodes=_POLISH_NODES,
        )
    except SolverCrashed:
        stats = dict(pre.stats or {}) | {"polish_crashed": 1.0}
        return replace(pre, stats=stats, seconds=pre.seconds + time.perf_counter() - began)
    seconds = pre.seconds + time.perf_counter() - began
    out_of_time = pre.out_of_time or result.stopped_by == "time"
    if result.x is None:
        return replace(pre, seconds=seconds, out_of_time=out_of_time)
    full = np.zeros(len(keep))
    full[keep] = result.x
    found = _read_choice(model, full)
    cost = valid_cost(model, found)
    if cost >= upper:
        return replace(pre, seconds=seconds, out_of_time=out_of_time)
    stats = dict(pre.stats or {}) | {"incumbent_us": cost}
    start = start_vector(model, found)
    return replace(
        pre, choice=found, start=start, stats=stats, seconds=seconds, out_of_time=out_of_time
    )


def _read_choice(model: IlpModel, x: np.ndarray) -> dict[str, int]:
    """Each class's strategy in solution ``x``: the allowed one with the largest value."""
    values = class_values(model, x)
    return {
        r: int(np.argmax(np.where(np.isfinite(c), values[r], -1.0)))
        for r, c in model.reduced.linear.items()
    }


def _mip(
    model: IlpModel,
    pre: Relaxation,
    below: float,
    *,
    solver: str,
    mip_gap: float,
    time_limit_s: float | None,
    max_nodes: int | None,
    stats: dict[str, float],
    node_work: int | None = None,
) -> Outcome:
    """The MIP of ``model`` for a plan cheaper than ``below``, over the columns the
    relaxation ``pre`` cannot rule out (all of them without one), warm-started from its
    incumbent; ``stats`` gets the number of columns fixed."""
    m = model.emitted.matrix
    keep, x0 = pre.keep(below), pre.start
    if keep is not None:
        stats["fixed"] = stats.get("fixed", 0.0) + float((~keep).sum())
    # Fixed columns are left out of the MIP altogether: a smaller model to write and presolve.
    sub = m.columns(keep) if keep is not None else m
    if keep is not None and x0 is not None:
        x0 = x0[keep]
    # A cost to beat goes to the solver too, as its cutoff: it prunes every node that
    # cannot beat it, and "infeasible" then proves that no plan does.
    cutoff = below if math.isfinite(below) and below < pre.upper else None
    nodes = node_limit(max_nodes, sub.num_cols, node_work)
    if nodes == 0:  # not run: past its work even at the floor of nodes
        stats.setdefault("node_limit", 0.0)  # a MIP cut at its nodes elsewhere says so
        stats["skipped_columns"] = max(stats.get("skipped_columns", 0.0), float(sub.num_cols))
        return Outcome(None, math.inf, pre.bound, "node_limit", pre.out_of_time)
    result = run(
        sub,
        solver,
        mip=True,
        time_limit_s=time_limit_s,
        mip_gap=mip_gap,
        start=x0,
        cutoff=cutoff,
        max_nodes=nodes,
    )
    if result.stopped_by == "nodes" and nodes is not None:
        stats["node_limit"] = max(stats.get("node_limit", 0.0), float(nodes))
    bound = pre.bound
    if math.isfinite(result.bound):
        bound = max(bound, result.bound) if math.isfinite(bound) else result.bound
    found, cost = None, math.inf
    if result.x is not None:  # checked, not trusted: a stopped CBC can write LP values
        x = np.zeros(m.num_cols)
        x[keep if keep is not None else slice(None)] = result.x
        found = _read_choice(model, x)
        cost = valid_cost(model, found)
    if cost >= below:
        found, cost = None, math.inf
    out_of_time = pre.out_of_time or result.stopped_by == "time"
    if result.status not in ("optimal", "infeasible"):
        status = "node_limit" if result.stopped_by == "nodes" else "time_limit"
        return Outcome(found, cost, bound, status, out_of_time)
    # Searched to the end: the plan found is the cheapest below ``below``, up to the
    # relative gap the solver was allowed; with none found, none is cheaper than ``below``
    # (CBC says "infeasible" under a cutoff), or, with nothing to beat, none exists.
    floor = min(cost, below) * (1.0 - mip_gap)
    if math.isfinite(floor):
        bound = max(bound, floor) if math.isfinite(bound) else floor
    status = "infeasible" if found is None and not math.isfinite(below) else "optimal"
    return Outcome(found, cost, bound, status, out_of_time)


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
    max_nodes: int | None = None,
    node_work: int | None = None,
    seed: tuple[Dual, Problem] | None = None,
    max_leaves: int | None = None,
    settle: float = ASCENT_CONVERGED_REFINE,
) -> Solution:
    """Solve ``model``; nodes with a single allowed strategy need no variable.

    With ``fixing``, the MIP runs after :func:`relax` (or on ``relaxed``, its result
    computed before; its seconds count in the solution's), under the branching on modes
    of :mod:`autoplan.ilp.solver.modes` when the model has them. ``start`` (a strategy
    per class, e.g. a plan of a more constrained model) is used as the incumbent when it
    is valid and cheaper than the LP-rounded one (by :func:`relax`, so not with
    ``relaxed``). ``cutoff`` is the cost of a plan known from elsewhere (an untied one,
    :mod:`autoplan.ilp.untying.untie`): the MIP then only looks for plans cheaper than
    it, and the plan returned may cost more than ``cutoff`` (the incumbent, when no
    cheaper plan exists). ``max_nodes`` caps each MIP's branch-and-bound nodes, and
    ``node_work`` with it the column-nodes of each (:func:`node_limit`); the solution then
    says ``node_limit`` and its stats the most nodes a MIP so cut was allowed
    (``node_limit``). ``seed`` starts the relaxation's dual ascent (see
    :func:`relax`). ``max_leaves`` makes the branching on modes a search of at most that
    many MIPs (:func:`~autoplan.ilp.solver.modes.branch_modes`). ``settle`` is the
    relaxations' tolerance at the LP's multiplier (:func:`relax`).

    The plan returned is checked, not trusted: its cost is recomputed from the
    reduced problem, and a solver that stops early with no valid plan (CBC
    can write its LP solution when stopped on time) falls back to the LP-rounded
    incumbent, reported as ``time_limit`` (or ``node_limit``).
    """
    check_solver(solver)
    start_time = time.perf_counter()
    if model.infeasible:
        return Solution("infeasible", float("nan"), {}, 0.0, solver)
    em, p = model.emitted, model.reduced
    m = em.matrix
    before = relaxed.seconds if relaxed is not None else 0.0  # spent before this call

    def left() -> float | None:
        """What is left of ``time_limit_s``, at least a second (None: no limit)."""
        if time_limit_s is None:
            return None
        return max(1.0, time_limit_s - before - (time.perf_counter() - start_time))

    def seconds() -> float:
        return before + time.perf_counter() - start_time

    if not m.num_cols:
        choice = {r: em.fixed.get(r, 0) for r in p.linear}
        cost = valid_cost(model, choice)
        nodes = {v: choice[r] for v, r in p.rep.items()}
        return Solution("optimal", cost, nodes, seconds(), solver, cost * (1.0 - mip_gap), {})
    pre = Relaxation()
    if fixing:
        if relaxed is None:
            relaxed = relax(
                model,
                solver=solver,
                time_limit_s=time_limit_s,
                start=start,
                seed=seed,
                settle=settle,
            )
        pre = relaxed
        if cutoff >= pre.upper:  # a better incumbent still makes the fixing stronger
            pre = _polish(model, solver, pre, left())
    stats = dict(pre.stats or {})
    below = min(cutoff, pre.upper)
    outcome = _search(
        model,
        pre,
        below,
        solver,
        mip_gap,
        left,
        (max_nodes, node_work, max_leaves, settle),
        stats,
        fixing=fixing,
    )
    found, cost = outcome.choice, outcome.cost
    if pre.choice is not None and (found is None or pre.upper <= cost):
        found, cost = pre.choice, pre.upper  # nothing cheaper than the incumbent
    status = outcome.status
    if found is None:
        # No plan: none exists (searched to the end with no cost to beat: the callers
        # that give a cutoff hold a plan), or a limit stopped the search before it found one.
        status = "infeasible" if status == "optimal" else status
        return Solution(status, float("nan"), {}, seconds(), solver, pre.bound, stats=stats)
    if status == "infeasible":  # the incumbent is a plan: nothing cheaper exists
        status = "optimal"
    if outcome.out_of_time:
        status = "time_limit"  # a step cut short by the clock: another run may differ
    bound = pre.bound
    if math.isfinite(outcome.bound):
        bound = max(bound, outcome.bound) if math.isfinite(bound) else outcome.bound
    if status == "optimal":  # proved, up to the relative gap the solver was allowed
        floor = cost * (1.0 - mip_gap)
        bound = min(cost, max(bound, floor)) if math.isfinite(bound) else floor
    nodes = {v: found[r] for v, r in p.rep.items()}
    return Solution(status, cost, nodes, seconds(), solver, bound, stats)


def _search(
    model: IlpModel,
    pre: Relaxation,
    below: float,
    solver: str,
    mip_gap: float,
    left: Callable[[], float | None],
    limits: tuple[int | None, int | None, int | None, float],
    stats: dict[str, float],
    *,
    fixing: bool,
) -> Outcome:
    """The MIP for a plan cheaper than ``below``: under the branching on modes when the
    model has them and a relaxation to branch from, else one MIP. ``limits``: the nodes
    and column-nodes of each MIP and the MIPs of the branching (None: no limit), and the
    relaxations' ``settle``."""
    max_nodes, node_work, max_leaves, settle = limits

    def leaf(node: IlpModel, rel: Relaxation, cost: float) -> Outcome:
        if rel is not pre:  # a branch's own incumbent, polished as the root's was
            rel = _polish(node, solver, rel, left())
        return _mip(
            node,
            rel,
            cost,
            solver=solver,
            mip_gap=mip_gap,
            time_limit_s=left(),
            max_nodes=max_nodes,
            stats=stats,
            node_work=node_work,
        )

    if not fixing or pre.choice is None or not mode_groups(model.reduced):
        return leaf(model, pre, below)
    return branch_modes(
        model,
        pre,
        below=below,
        mip_gap=mip_gap,
        relax=lambda node, parent, rel, enough: relax(
            node,
            solver=solver,
            time_limit_s=left(),
            seed=(rel.dual, parent.reduced) if rel.dual is not None else None,
            enough=enough,
            settle=settle,
        ),
        leaf=leaf,
        max_leaves=max_leaves,
    )
