"""Stage 5b, solve: run a MILP solver on the built ILP and read the choice back.

Input: an :class:`~autoplan.ilp.build.IlpModel`. Output: a :class:`Solution`
(status, objective, the chosen strategy index of every node).

CBC ships inside PuLP, so planning needs no extra install; HiGHS
(``highspy``) is used when asked for and installed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pulp

from autoplan.ilp.build import IlpModel

SOLVERS = ("cbc", "highs")


@dataclass(frozen=True)
class Solution:
    """What the solver found. ``choice`` is empty unless a solution exists."""

    status: str  # "optimal" | "time_limit" | "infeasible"
    objective_us: float
    choice: dict[str, int]
    solve_seconds: float
    solver: str


def _cbc_path() -> str:
    """The CBC binary: PuLP's bundled one, or one on PATH."""
    import os
    import shutil

    bundled = os.path.join(
        os.path.dirname(pulp.__file__), "solverdir", "cbc", "linux", "i64", "cbc"
    )
    return bundled if os.path.exists(bundled) else (shutil.which("cbc") or "cbc")


def _make_solver(name: str, time_limit_s: float | None, mip_gap: float) -> pulp.LpSolver:
    if name == "cbc":
        # CBC's primal heuristics rarely pay on this ILP (its LP relaxation is
        # nearly integral) and the dual simplex suits its re-solves: on LLaMA3-8B
        # 2 layers with a memory budget, 21 s -> 6 s, same optimum.
        return pulp.COIN_CMD(
            path=_cbc_path(),
            msg=False,
            timeLimit=time_limit_s,
            gapRel=mip_gap,
            options=["heur off", "dualS"],
        )
    if name == "highs":
        solver = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=mip_gap)
        if not solver.available():
            raise ValueError(
                "solver 'highs' needs the highspy package: pip install 'autoplan[highs]', "
                "or use solver: cbc"
            )
        return solver
    raise ValueError(f"solver {name!r} is not known; allowed: {', '.join(SOLVERS)}")


def solve(
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    mip_gap: float = 0.0,
) -> Solution:
    """Solve ``model``; nodes with a single allowed strategy need no variable."""
    start = time.perf_counter()
    if model.infeasible:
        return Solution("infeasible", float("nan"), {}, 0.0, solver)
    has_vars = any(x is not None for xs in model.choice_vars.values() for x in xs)
    if has_vars:
        code = model.problem.solve(_make_solver(solver, time_limit_s, mip_gap))
        status_name = pulp.LpStatus[code]
    else:
        status_name = "Optimal"
    seconds = time.perf_counter() - start
    if status_name in ("Infeasible", "Undefined") or (
        status_name == "Not Solved" and model.problem.sol_status != pulp.LpSolutionIntegerFeasible
    ):
        return Solution("infeasible", float("nan"), {}, seconds, solver)
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
    return Solution(status, float(objective), choice, seconds, solver)
