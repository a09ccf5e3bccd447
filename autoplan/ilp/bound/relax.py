"""Stage 5c (bound), relax: the relaxation's bound, column prices and a first plan.

Input: an :class:`~autoplan.ilp.formulation.build.IlpModel`. Output: a :class:`Relaxation`:
a lower bound, per column a price ``d_j`` (every plan using column j costs at
least the bound plus it), the plan to start the MIP from and its cost, and the
strategies the LP relaxation uses.

Why a step of its own: the MIP (:mod:`autoplan.ilp.solver.solve`) fixes every column
priced above the incumbent's gap, and the untie step (:mod:`autoplan.ilp.untying.untie`)
runs between the two, reading the LP's strategies. How: dual ascent
(:mod:`autoplan.ilp.bound.dual`) gives the bound and prices and decodes a plan; the
LP relaxation is then solved only over the columns priced near zero, a small share
of them and far quicker than the whole LP, which says which strategies the
relaxation uses and what the memory row is worth, and the ascent settles its bound
at that price. When no plan can be decoded, the whole LP is solved instead. Both LPs
go through :mod:`autoplan.ilp.backends`, which needs nothing past the
formulation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from autoplan.ilp.backends import check_solver, run
from autoplan.ilp.bound.dual import Ascent, Dual
from autoplan.ilp.bound.dual_prices import column_reduced_costs, decode
from autoplan.ilp.bound.incumbent import cost_of, from_lp, from_plan, memory_of
from autoplan.ilp.formulation.build import IlpModel, Warm
from autoplan.ilp.formulation.matrix import Matrix
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.tolerances import (
    ASCENT_CONVERGED_REFINE,
    BUDGET_BINDS,
    GAP_NOISE,
    LP_NONZERO,
    ROUNDING_RTOL,
)

__all__ = ["Relaxation", "class_values", "relax", "start_vector", "valid_cost"]


# The LP of relax keeps the columns whose dual reduced cost is within this share of the
# bound...
_USED_SHARE = 1e-5
# ... and of the decoded plan's gap to the bound, times _NEAR_GROWTH per round (at most
# _NEAR_ROUNDS) until the LP's value and the bound meet within _MET of that gap, or the
# LP's value stops falling as columns are added (the gap is then the ascent's).
_NEAR_SHARE = 0.05
_NEAR_GROWTH = 5.0
_NEAR_ROUNDS = 3
_MET = 0.05
# A round's LP takes at most this many times the columns of the round before, those of
# least price: an LP's time grows faster than its columns, and a round's distance to the
# bound can ask for nearly every column at once...
_COLUMN_GROWTH = 2.0
# ... or this many, whichever is more: an LP this small solves in seconds, and cutting
# it leaves duals far from the whole LP's (a weak bound, a large MIP after).
_FEW_COLUMNS = 200_000


def _per_class(
    model: IlpModel, vec: np.ndarray, *, absent: float, lone: float
) -> dict[str, np.ndarray]:
    """Column vector ``vec`` read per class and strategy: ``absent`` where a strategy has
    no column, ``lone`` on a class's only strategy."""
    out = {}
    for r, cols in model.emitted.class_cols.items():
        v = np.where(cols >= 0, vec[np.maximum(cols, 0)], absent)
        if r in model.emitted.fixed:
            v[model.emitted.fixed[r]] = lone
        out[r] = v
    return out


def class_values(model: IlpModel, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each class's value per strategy (0 where it has no column; 1 on a lone strategy)."""
    return _per_class(model, x, absent=0.0, lone=1.0)


def start_vector(model: IlpModel, choice: dict[str, int]) -> np.ndarray:
    """The column values of plan ``choice`` (one strategy per class): the warm start."""
    em, p = model.emitted, model.reduced
    x = np.zeros(em.matrix.num_cols)
    for r, cols in em.class_cols.items():
        if cols[choice[r]] >= 0:
            x[cols[choice[r]]] = 1.0
    for k, e in enumerate(p.edges):
        x[em.move_columns(k, e.src_group[choice[e.src]], e.dst_group[choice[e.dst]])] = 1.0
    return x


@dataclass(frozen=True)
class Relaxation:
    """What the relaxation and the incumbent give the MIP (:func:`relax`).

    ``bound`` is a lower bound on every plan; ``choice`` the incumbent plan per class
    (None when none was found) and ``start`` its column values; ``x`` the LP's column
    values and ``dj`` each column's price (a plan using column j costs at least
    ``bound + dj[j]``); ``lp_values[r]`` and ``lp_reduced[r]`` the same per strategy of
    class r (a lone strategy has value 1 and price 0, one that cannot be chosen value 0
    and price inf); ``binds`` whether the LP spends the whole memory budget;
    ``seconds`` the time it took; ``warm`` the state its dual ascent ended in;
    ``out_of_time`` whether the time limit cut a step short (everything here is still
    valid, but another run could find another bound or plan); ``dual`` the dual
    ascent's result, which seeds the ascent on a restriction or an untied copy of this
    model.
    """

    bound: float = math.nan
    stats: dict[str, float] | None = None
    choice: dict[str, int] | None = None
    start: np.ndarray | None = None
    x: np.ndarray | None = None
    dj: np.ndarray | None = None
    lp_values: dict[str, np.ndarray] | None = None
    lp_reduced: dict[str, np.ndarray] | None = None
    binds: bool = False
    seconds: float = 0.0
    warm: Warm | None = None
    out_of_time: bool = False
    dual: Dual | None = None

    @property
    def upper(self) -> float:
        """The incumbent's cost (inf without one)."""
        return (self.stats or {}).get("incumbent_us", math.inf)

    def keep(self, cutoff: float = math.inf) -> np.ndarray | None:
        """The columns a plan cheaper than both the incumbent and ``cutoff`` may use, by the
        column prices ``dj``, and the incumbent's own (None: no incumbent, keep all)."""
        if self.choice is None or self.x is None or self.dj is None or self.start is None:
            return None
        upper = min(self.upper, cutoff)
        gap = upper - self.bound + GAP_NOISE * max(1.0, abs(upper))
        return ~((self.x <= LP_NONZERO) & (self.dj > gap) & (self.start == 0.0))


def relax(
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    start: Mapping[str, int] | None = None,
    seed: tuple[Dual, Problem] | None = None,
    enough: float = math.inf,
    settle: float = ASCENT_CONVERGED_REFINE,
    lam: float | None = None,
) -> Relaxation:
    """Lower bound, incumbent (the plan decoded from the bound's reduced costs, or
    ``start``, a strategy per class, when cheaper) and the reduced costs that let the MIP
    drop columns. The bound comes from dual ascent (:mod:`autoplan.ilp.bound.dual`); when
    no plan can be decoded from it, from the LP relaxation solved by ``solver``.
    :func:`~autoplan.ilp.solver.solve.solve` polishes the incumbent when no cheaper plan is
    known from elsewhere. ``seed`` (the dual of a model of the same cost table, and that
    model's problem: the model tied, or one this one restricts) starts the ascent; a
    bound of ``enough`` or more is returned at once, alone (the caller only needs to know
    that no plan here is cheaper). ``settle`` is how little a sweep must raise the bound,
    at the LP's multiplier, for the ascent to stop: a search that proves nothing can take
    the multiplier search's looser tolerance. ``lam``: a memory multiplier a solve of a
    nearly equal problem ended at, which the ascent tries after its own search
    (:meth:`~autoplan.ilp.bound.dual.Ascent.raise_bound`)."""
    check_solver(solver)
    began = time.perf_counter()
    m, p = model.emitted.matrix, model.reduced
    if model.infeasible or not m.num_cols:
        return Relaxation()
    ascent = Ascent(p, time_limit_s=time_limit_s, warm=model.warm, seed=seed)
    ascent.raise_bound(enough, lam)
    dual = ascent.result()
    if dual.bound >= enough:
        stats = {"bound_us": dual.bound, "sweeps": float(dual.sweeps)}
        seconds = time.perf_counter() - began
        return Relaxation(dual.bound, stats, seconds=seconds, out_of_time=ascent.out_of_time)
    found = from_plan(p, decode(p, dual))
    if found is None:
        whole = _relax_lp(model, solver, time_limit_s, start, began)
        return replace(whole, out_of_time=whole.out_of_time or ascent.out_of_time)
    dj = column_reduced_costs(p, model.emitted, dual)
    # The LP over the columns the bound prices near zero: its optimum is the full LP's
    # or near it, found in a fraction of the time. It says which strategies the
    # relaxation uses, rounds to a better plan than the decoded one, and its memory
    # row's dual is the multiplier at which the sweeps then settle the bound. When the
    # two do not meet, the columns were too few: the share grows.
    x0 = start_vector(model, found[0])
    x, keep = x0.copy(), x0 > 0  # the decoded plan alone is a feasible LP solution
    near = _NEAR_SHARE * (found[1] - dual.bound)
    out_of_time = ascent.out_of_time
    last, most = math.inf, math.inf
    for _ in range(_NEAR_ROUNDS):
        left = _left(time_limit_s, began)
        if left is not None and left <= 0.0:
            out_of_time = True
            break  # out of time: the decoded plan and the bound so far stand
        keep = _cheapest(dj, max(near, _USED_SHARE * abs(dual.bound)), x0 > 0, most)
        most = max(_COLUMN_GROWTH * keep.sum(), _FEW_COLUMNS)
        lp = run(m.columns(keep), solver, mip=False, time_limit_s=left, mip_gap=0.0)
        out_of_time |= lp.stopped_by == "time"
        x = x0.copy()
        if lp.status == "optimal" and lp.x is not None:  # a stopped simplex's x may not hold
            x = np.zeros(m.num_cols)
            x[keep] = lp.x
        lam = _memory_multiplier(m, lp.y, dual.lam)
        if lam is not None and ascent.refine(lam, settle):
            refined = ascent.result()
            if refined.bound > dual.bound:
                dual, dj = refined, column_reduced_costs(p, model.emitted, refined)
        value = float(m.cost @ x) + m.offset
        if keep.all() or value - dual.bound <= _MET * max(found[1] - dual.bound, 0.0):
            break
        # more columns can only lower the LP's value: when growing them did not, the
        # distance left is the ascent's bound stalling below the LP, not too few columns
        if value >= last - ROUNDING_RTOL * abs(last):
            break
        last = value
        # too few columns: take every one priced within the LP's distance to the bound
        near = max(_NEAR_GROWTH * near, value - dual.bound)
    values = class_values(model, x)
    rounded = from_lp(p, values)
    if rounded is not None and rounded[1] < found[1]:
        found = rounded
    found = _with_start(model, found, start)
    stats = {
        "bound_us": dual.bound,
        "sweeps": float(dual.sweeps),
        "lp_columns": float(keep.sum()),
    }
    relaxation = _relaxation(
        model, dual.bound, stats, found, x, dj, values, dual.reduced, _binds(p, values), began
    )
    return replace(
        relaxation,
        warm=ascent.warm(),
        out_of_time=out_of_time or ascent.out_of_time,
        dual=dual,
    )


def _cheapest(dj: np.ndarray, near: float, used: np.ndarray, most: float) -> np.ndarray:
    """The columns priced within ``near`` and the ``used`` ones; over ``most`` columns,
    the used and then the least priced up to ``most`` (ties by column)."""
    keep = (dj <= near) | used
    if keep.sum() <= most:
        return keep
    extra = int(most) - int(used.sum())
    if extra <= 0:
        return used.copy()
    order = np.argsort(np.where(used | (dj > near), np.inf, dj), kind="stable")
    keep = used.copy()
    keep[order[:extra]] = True
    return keep


def _left(time_limit_s: float | None, began: float) -> float | None:
    """What is left of ``time_limit_s`` since ``began`` (None: no limit)."""
    if time_limit_s is None:
        return None
    return time_limit_s - (time.perf_counter() - began)


def _memory_multiplier(m: Matrix, y: np.ndarray | None, lam: float) -> float | None:
    """The multiplier to settle the bound at: the memory row's price in microseconds per
    MiB from an LP's row duals, or ``lam`` when the matrix has no memory row (the only
    row with no lower bound). None without duals, or when the LP's row does not bind
    while ``lam`` says it does (the LP's columns are then too few to tell)."""
    rows = np.flatnonzero(np.isneginf(m.row_lower))
    if y is None:
        return None
    if len(rows) != 1:
        return lam
    price = max(0.0, -float(y[rows[0]]))
    return None if price == 0.0 and lam > 0 else price


def _binds(p: Problem, values: dict[str, np.ndarray]) -> bool:
    """Whether the relaxation's solution spends all of the memory budget."""
    used = sum(float(np.dot(mem, values[r])) for r, mem in p.memory.items() if r in values)
    return p.budget is not None and used >= p.budget * (1 - BUDGET_BINDS)


def _with_start(
    model: IlpModel,
    found: tuple[dict[str, int], float] | None,
    start: Mapping[str, int] | None,
) -> tuple[dict[str, int], float] | None:
    """The cheaper of the rounded plan ``found`` and ``start`` (when valid)."""
    if start is None:
        return found
    known = {r: int(start[r]) for r in model.reduced.linear}
    cost = valid_cost(model, known)
    if found is None or cost < found[1]:
        return (known, cost) if math.isfinite(cost) else found
    return found


def _relaxation(
    model: IlpModel,
    bound: float,
    stats: dict[str, float],
    found: tuple[dict[str, int], float] | None,
    x: np.ndarray,
    dj: np.ndarray,
    values: dict[str, np.ndarray],
    reduced: dict[str, np.ndarray],
    binds: bool,
    began: float,
) -> Relaxation:
    choice = x0 = None
    if found is not None:
        choice, upper = found
        stats["rounded_us"] = stats["incumbent_us"] = upper
        x0 = start_vector(model, choice)
    seconds = time.perf_counter() - began
    return Relaxation(bound, stats, choice, x0, x, dj, values, reduced, binds, seconds)


def _relax_lp(
    model: IlpModel,
    solver: str,
    time_limit_s: float | None,
    start: Mapping[str, int] | None,
    began: float,
) -> Relaxation:
    """:func:`relax` by the LP relaxation solved with ``solver``."""
    m, p = model.emitted.matrix, model.reduced
    lp = run(m, solver, mip=False, time_limit_s=time_limit_s, mip_gap=0.0)
    if lp.status != "optimal" or lp.x is None or lp.dj is None:
        return Relaxation(seconds=time.perf_counter() - began, out_of_time=lp.stopped_by == "time")
    bound = float(m.cost @ lp.x) + m.offset
    values = class_values(model, lp.x)
    reduced = _per_class(model, lp.dj, absent=math.inf, lone=0.0)
    found = _with_start(model, from_lp(p, values), start)
    stats = {"bound_us": bound}
    return _relaxation(
        model, bound, stats, found, lp.x, lp.dj, values, reduced, _binds(p, values), began
    )


def valid_cost(model: IlpModel, choice: dict[str, int]) -> float:
    """The exact cost of a class choice, or inf if it breaks an edge or the memory budget."""
    p = model.reduced
    if p.budget is not None and p.memory and memory_of(p, choice) > p.budget * (1 + ROUNDING_RTOL):
        return math.inf
    return cost_of(p, choice)
