"""Stage 5b, solve: run a MILP solver on the built ILP and read the choice back.

Input: an :class:`~autoplan.ilp.build.IlpModel`. Output: a :class:`Solution`
(status, objective, lower bound, the chosen strategy index of every node).

CBC ships inside PuLP, so planning needs no extra install; HiGHS
(``highspy``) is used when asked for and installed.

Reduced-cost fixing (``fixing=True``), exact: solve the LP relaxation first
(bound ``LB``, reduced costs ``d``), round it to a feasible plan of cost
``UB`` (:mod:`autoplan.ilp.incumbent`), then solve the MIP with that plan as
warm start and every variable with ``d_j > UB - LB`` fixed to 0. Any plan
using such a variable costs at least ``LB + d_j > UB`` (LP duality), so no
plan cheaper than the incumbent is cut off, and the incumbent itself stays.
The memory row makes the LP fractional and the branch and bound long; on
LLaMA3-8B the fixing drops two thirds of the variables and most of the tree.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass

import numpy as np
import pulp

from autoplan.ilp.build import IlpModel
from autoplan.ilp.incumbent import from_lp

SOLVERS = ("cbc", "highs")


@dataclass(frozen=True)
class Solution:
    """What the solver found. ``choice`` is empty unless a solution exists.

    ``bound_us`` is a proven lower bound on the optimum (nan when unknown);
    ``stats`` says what the reduced-cost fixing did.
    """

    status: str  # "optimal" | "time_limit" | "infeasible"
    objective_us: float
    choice: dict[str, int]
    solve_seconds: float
    solver: str
    bound_us: float = math.nan
    stats: dict[str, float] | None = None

    @property
    def gap(self) -> float:
        """Relative gap between the plan and the bound (0 when optimal, nan when unknown)."""
        if self.status == "optimal":
            return 0.0
        if not math.isfinite(self.bound_us) or not self.objective_us:
            return math.nan
        return max(0.0, (self.objective_us - self.bound_us) / abs(self.objective_us))


def _cbc_path() -> str:
    """The CBC binary: PuLP's bundled one, or one on PATH."""
    bundled = os.path.join(
        os.path.dirname(pulp.__file__), "solverdir", "cbc", "linux", "i64", "cbc"
    )
    return bundled if os.path.exists(bundled) else (shutil.which("cbc") or "cbc")


def _make_solver(
    name: str, time_limit_s: float | None, mip_gap: float, *, mip: bool = True, warm: bool = False
) -> pulp.LpSolver:
    if name == "cbc":
        # CBC's primal heuristics rarely pay on this ILP (its LP relaxation is
        # nearly integral) and the dual simplex suits its re-solves: on LLaMA3-8B
        # 2 layers with a memory budget, 21 s -> 6 s, same optimum.
        return pulp.COIN_CMD(
            path=_cbc_path(),
            msg=False,
            mip=mip,
            timeLimit=time_limit_s,
            gapRel=mip_gap,
            warmStart=warm,
            options=["heur off", "dualS"],
        )
    if name == "highs":
        solver = pulp.HiGHS(
            msg=False, mip=mip, timeLimit=time_limit_s, gapRel=mip_gap, warmStart=warm
        )
        if not solver.available():
            raise ValueError(
                "solver 'highs' needs the highspy package: pip install 'autoplan[highs]', "
                "or use solver: cbc"
            )
        return solver
    raise ValueError(f"solver {name!r} is not known; allowed: {', '.join(SOLVERS)}")


def _relax(model: IlpModel, solver: str, time_limit_s: float | None) -> float | None:
    """Solve the LP relaxation in place (values and reduced costs); its optimum, or None."""
    code = model.problem.solve(_make_solver(solver, time_limit_s, 0.0, mip=False))
    if pulp.LpStatus[code] != "Optimal":
        return None
    return float(pulp.value(model.problem.objective))


def _class_values(model: IlpModel) -> dict[str, np.ndarray]:
    return {
        r: np.array([(x.varValue or 0.0) if x is not None else 0.0 for x in xs])
        for r, xs in model.class_vars.items()
    }


def _set_start(model: IlpModel, choice: dict[str, int]) -> None:
    """Give every variable its value in ``choice`` (the warm start)."""
    p = model.reduced
    assert p is not None
    for r, xs in model.class_vars.items():
        for i, x in enumerate(xs):
            if x is not None:
                x.varValue = 1.0 if i == choice[r] else 0.0
    for e, made in zip(p.edges, model.edge_vars, strict=True):
        on = (int(e.src_group[choice[e.src]]), int(e.dst_group[choice[e.dst]]))
        for key, x in made.items():
            x.varValue = 1.0 if key == on else 0.0


def _prefix(
    model: IlpModel, solver: str, time_limit_s: float | None
) -> tuple[float, dict[str, float], list[tuple[pulp.LpVariable, float | None]]]:
    """LP bound, incumbent and fixing before the MIP; returns (bound, stats, fixed bounds)."""
    p = model.reduced
    bound = _relax(model, solver, time_limit_s) if p is not None else None
    if bound is None or p is None:
        return math.nan, {}, []
    found = from_lp(p, _class_values(model))
    if found is None:
        return bound, {"lp_bound_us": bound}, []
    choice, upper = found
    # margin for the LP's tolerances, far below any price difference that matters
    gap = upper - bound + 1e-6 * max(1.0, abs(upper))
    dead = [
        x
        for x in model.problem.variables()
        if (x.varValue or 0.0) <= 1e-9 and x.dj is not None and x.dj > gap
    ]
    _set_start(model, choice)  # overwrites the LP values
    fixed = [(x, x.upBound) for x in dead if not x.varValue]  # never the incumbent's own
    for x, _ in fixed:
        x.upBound = 0
    stats = {"lp_bound_us": bound, "incumbent_us": upper, "fixed": float(len(fixed))}
    return bound, stats, fixed


def solve(
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    mip_gap: float = 0.0,
    fixing: bool = True,
) -> Solution:
    """Solve ``model``; nodes with a single allowed strategy need no variable."""
    start = time.perf_counter()
    if model.infeasible:
        return Solution("infeasible", float("nan"), {}, 0.0, solver)
    has_vars = any(x is not None for xs in model.choice_vars.values() for x in xs)
    bound, stats, fixed = math.nan, {}, []
    if has_vars:
        if fixing:
            bound, stats, fixed = _prefix(model, solver, time_limit_s)
        left = time_limit_s
        if time_limit_s is not None:
            left = max(1.0, time_limit_s - (time.perf_counter() - start))
        warm = "incumbent_us" in stats
        code = model.problem.solve(_make_solver(solver, left, mip_gap, warm=warm))
        for x, ub in fixed:
            x.upBound = ub
        status_name = pulp.LpStatus[code]
    else:
        status_name = "Optimal"
    seconds = time.perf_counter() - start
    if status_name in ("Infeasible", "Undefined") or (
        status_name == "Not Solved" and model.problem.sol_status != pulp.LpSolutionIntegerFeasible
    ):
        return Solution("infeasible", float("nan"), {}, seconds, solver, stats=stats)
    choice: dict[str, int] = {}
    for v, xs in model.choice_vars.items():
        if all(x is None for x in xs):
            choice[v] = int(np.flatnonzero(model.allowed[v])[0])
            continue
        values = [(x.varValue or 0.0) if x is not None else -1.0 for x in xs]
        choice[v] = int(np.argmax(values))
    objective = pulp.value(model.problem.objective) if has_vars else model.fixed_cost
    optimal = status_name == "Optimal" and model.problem.sol_status == pulp.LpSolutionOptimal
    status = "optimal" if optimal or not has_vars else "time_limit"
    return Solution(status, float(objective), choice, seconds, solver, bound, stats)
