"""Stages 5c and 5e, the solvers: hand a :class:`~autoplan.ilp.formulation.matrix.Matrix` to a solver.

Input: the matrix, whether to keep integrality (``mip``), the user's time limit, a
relative gap, optionally a node limit, a start vector and a cutoff. Output: a
:class:`RunResult` with the status, which limit stopped the run (if one did), the column
values and, for an LP, the reduced costs and row duals.

Both solvers are deterministic for the same arrays and options: a run that no limit
stops, or that stops on its node limit, gives the same answer on any machine under any
load. Only the time limit (the user's ``time_limit_s``) reads the clock, and a run it
stops says so (``stopped_by="time"``).

CBC ships inside PuLP as a binary: the matrix is written as a free-format MPS
file, CBC runs on it (with the options :func:`_run_cbc` gives, each with its reason)
as a child process that :mod:`autoplan.ilp.owned_process` owns, and writes a solution
file with values and reduced costs, which is read back with numpy. HiGHS (``highspy``,
the optional ``highs`` extra) takes the arrays in memory.
Why no modelling layer: a Python object per variable is slow to build and write on
the planner's large ILPs. Why beside the sub-packages: the bound's LP
(:mod:`autoplan.ilp.bound.relax`) and the MIP (:mod:`autoplan.ilp.solver.solve`) both run
here, and it needs nothing past the formulation.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import NamedTuple, TextIO

import numpy as np
import pulp
from pulp.apis import coin_api

from autoplan.core.config import SOLVERS
from autoplan.core.errors import PlanError
from autoplan.ilp.formulation.matrix import Matrix
from autoplan.ilp.owned_process import run_owned

# Seconds CBC may run past its time limit before it is stopped (see _run_cbc).
_GRACE_S = 5.0


class SolverCrashed(RuntimeError):
    """The solver's process ended without writing an answer (a crash or a signal); the
    message names the solver, its exit code and its last lines of output."""


@dataclass(frozen=True)
class RunResult:
    """``status``: "optimal", "feasible" (stopped with a solution), "infeasible" or
    "stopped" (no solution); ``x`` the column values (None without a solution);
    ``dj`` reduced costs and ``y`` row duals (LP only); ``bound`` a proven lower bound when
    the solver gives one; ``stopped_by`` the limit that stopped the run: "time" (the
    clock: not reproducible), "nodes" (the node limit: reproducible) or "" (none)."""

    status: str
    x: np.ndarray | None
    dj: np.ndarray | None = None
    bound: float = float("nan")
    y: np.ndarray | None = None
    stopped_by: str = ""


def check_solver(name: str) -> None:
    """Raise a ValueError naming the fix when solver ``name`` cannot run here."""
    if name not in SOLVERS:
        raise PlanError(f"solver {name!r} is not known; allowed: {', '.join(SOLVERS)}")
    if name == "cbc":
        cbc_path()
    if name == "highs":
        try:
            import highspy  # noqa: F401
        except ImportError as err:
            raise PlanError(
                "solver 'highs' needs the highspy package: pip install 'autoplan[highs]', "
                "or use solver: cbc"
            ) from err


def run(
    m: Matrix,
    solver: str,
    *,
    mip: bool,
    time_limit_s: float | None,
    mip_gap: float,
    start: np.ndarray | None = None,
    cutoff: float | None = None,
    max_nodes: int | None = None,
) -> RunResult:
    """Solve ``m`` (its LP relaxation when ``mip`` is False) with ``solver``.

    ``cutoff`` (MIP only): look only for solutions cheaper than it. When none exists,
    CBC says ``infeasible``; HiGHS stops once its bound passes the cutoff and returns
    its best solution (perhaps ``start``) as ``optimal``, with that bound. ``max_nodes``
    (MIP only): stop after that many branch-and-bound nodes, a limit of work that gives
    the same answer on every machine (``time_limit_s`` does not).
    """
    check_solver(solver)
    job = _Job(m, mip, time_limit_s, mip_gap, start, cutoff, max_nodes)
    return _run_highs(job) if solver == "highs" else _run_cbc(job)


class _Job(NamedTuple):
    """One solver call, as :func:`run` takes it."""

    m: Matrix
    mip: bool
    time_limit_s: float | None
    mip_gap: float
    start: np.ndarray | None
    cutoff: float | None
    max_nodes: int | None


# ----------------------------------------------------------------------------- HiGHS


def _run_highs(job: _Job) -> RunResult:
    import highspy

    m, mip, time_limit_s, mip_gap, start, cutoff, max_nodes = job

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    if mip and cutoff is not None:
        h.setOptionValue("objective_bound", float(cutoff))
    if mip and max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    lp = highspy.HighsLp()
    lp.num_col_ = m.num_cols
    lp.num_row_ = m.num_rows
    lp.col_cost_ = m.cost
    lp.col_lower_ = np.zeros(m.num_cols)
    lp.col_upper_ = m.upper
    lp.row_lower_ = m.row_lower
    lp.row_upper_ = m.row_upper
    lp.offset_ = m.offset
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = m.start
    lp.a_matrix_.index_ = m.index
    lp.a_matrix_.value_ = m.value
    if mip:
        var = highspy.HighsVarType
        lp.integrality_ = [var.kInteger if i else var.kContinuous for i in m.integer]
    h.passModel(lp)
    if mip and start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    kinds = highspy.HighsModelStatus
    stopped_by = ""
    if status == kinds.kTimeLimit:
        stopped_by = "time"
    elif status in (kinds.kSolutionLimit, kinds.kIterationLimit):
        stopped_by = "nodes"  # mip_max_nodes
    if status == kinds.kInfeasible:
        return RunResult("infeasible", None)
    if not has_solution:
        return RunResult("stopped", None, stopped_by=stopped_by)
    name = "optimal" if status == kinds.kOptimal else "feasible"
    sol = h.getSolution()
    x = np.asarray(sol.col_value, dtype=np.float64)
    dj = None if mip else np.asarray(sol.col_dual, dtype=np.float64)
    y = None if mip else np.asarray(sol.row_dual, dtype=np.float64)
    bound = float(info.mip_dual_bound) if mip else float(info.objective_function_value)
    return RunResult(name, x, dj, bound, y, stopped_by=stopped_by)


# ----------------------------------------------------------------------------- CBC


def cbc_path() -> str:
    """The CBC binary: the one PuLP bundles for this platform (the path PuLP itself builds
    from the operating system and architecture), else the one PuLP's ``COIN_CMD`` finds
    (``pip install pulp[cbc]``, or a ``cbc`` on PATH); a PlanError naming the fixes when
    there is neither."""
    bundled = os.path.realpath(coin_api.pulp_cbc_path)
    if os.path.isfile(bundled) and os.access(bundled, os.X_OK):
        return bundled
    found = pulp.COIN_CMD(msg=False).available()
    if not found:
        raise PlanError(
            "solver 'cbc' needs a CBC binary, and PuLP bundles none for this platform and "
            "finds none installed: pip install 'pulp[cbc]' (or conda install coin-or-cbc, "
            "apt install coinor-cbc, brew install cbc), or use solver: highs "
            "(pip install 'autoplan[highs]')"
        )
    return str(found)


def _texts(v: np.ndarray) -> np.ndarray:
    """Each float's ``repr`` (which CBC reads back exactly) in an object array; each
    distinct value is formatted once (most matrix entries are 1 or -1)."""
    distinct, where = np.unique(v, return_inverse=True)
    return _strings([repr(x) for x in distinct.tolist()])[where.ravel()]


def _strings(items: list[str]) -> np.ndarray:
    """``items`` as a 1-d object array, so that ``+`` concatenates element by element."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


# Columns formatted per write of an MPS file: its lines are Python strings, one per matrix
# entry, and a 4-D mesh's ILP has tens of millions of entries, gigabytes as strings at once.
_MPS_COLUMNS = 1 << 16


def write_mps(m: Matrix, path: str) -> None:
    """Free-format MPS: columns ``x<j>``, rows ``c<i>``, objective ``obj``; binaries in markers.

    Lines are made by concatenating object arrays of strings (names once per row and
    column, values once per distinct value) rather than one f-string per entry, which
    is far slower on a large matrix, :data:`_MPS_COLUMNS` columns at a time.
    """
    rows = _strings([f" c{i}" for i in range(m.num_rows)])
    kinds = np.where(
        np.isneginf(m.row_lower), " L", np.where(np.isposinf(m.row_upper), " G", " E")
    ).astype(object)
    num_int = int(m.integer.sum())
    assert m.integer[:num_int].all(), "binary columns come first"
    rhs = np.where(np.isneginf(m.row_lower), m.row_upper, m.row_lower)
    set_rows = np.flatnonzero(rhs)
    named = rows + " "
    with open(path, "w") as f:
        _write_lines(f, ["NAME autoplan", "ROWS", " N obj", *(kinds + rows).tolist(), "COLUMNS"])
        if num_int:
            f.write(" M1 'MARKER' 'INTORG'\n")
        for lo, hi in _spans(0, num_int):
            _write_lines(f, _column_lines(m, named, lo, hi))
        if num_int:
            f.write(" M2 'MARKER' 'INTEND'\n")
        for lo, hi in _spans(num_int, m.num_cols):
            _write_lines(f, _column_lines(m, named, lo, hi))
        f.write("RHS\n")
        _write_lines(f, (" rhs" + rows[set_rows] + " " + _texts(rhs[set_rows])).tolist())
        if m.offset:
            f.write(f" rhs obj {-m.offset!r}\n")  # MPS: the objective row's RHS is -offset
        f.write("BOUNDS\n")
        for lo, hi in _spans(0, m.num_cols):
            cols = _strings([f" UP bnd x{j} " for j in range(lo, hi)])
            _write_lines(f, (cols + _texts(m.upper[lo:hi])).tolist())
        f.write("ENDATA\n")


def _spans(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` in pieces of :data:`_MPS_COLUMNS` columns."""
    return [(a, min(a + _MPS_COLUMNS, hi)) for a in range(lo, hi, _MPS_COLUMNS)]


def _write_lines(f: TextIO, lines: list[str]) -> None:
    if lines:
        f.write("\n".join(lines) + "\n")


def _column_lines(m: Matrix, row_names: np.ndarray, lo: int, hi: int) -> list[str]:
    """The COLUMNS lines of columns ``lo`` to ``hi``: each column's entries contiguous, its
    objective coefficient (row "obj", written for every column so that none goes
    undeclared) first, then its matrix rows."""
    first, last = int(m.start[lo]), int(m.start[hi])
    num = np.diff(m.start[lo : hi + 1])
    col_of = np.repeat(np.arange(hi - lo), num + 1)
    heads = m.start[lo:hi] - first + np.arange(hi - lo)  # each column's objective entry
    body = np.ones(len(col_of), dtype=bool)
    body[heads] = False
    names = np.empty(len(col_of), dtype=object)
    names[heads] = " obj "
    names[body] = row_names[m.index[first:last]]
    values = np.empty(len(col_of))
    values[heads] = m.cost[lo:hi]
    values[body] = m.value[first:last]
    cols = _strings([f" x{j}" for j in range(lo, hi)])
    return (cols[col_of] + names + _texts(values)).tolist()


def _write_start(x: np.ndarray, path: str) -> None:
    """A CBC solution file holding ``x``: CBC's ``-mips`` reads it as the MIP start."""
    lines = ["Stopped on time - objective value 0"]
    lines += [f"{j} x{j} {v!r} 0" for j, v in enumerate(x.tolist())]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_cbc_solution(
    path: str, num_cols: int, num_rows: int = 0
) -> tuple[str, np.ndarray | None, np.ndarray, np.ndarray]:
    """Status word, column values, reduced costs and row duals from CBC's ``-solution``
    file (rows ``c<i>``, then columns ``x<j>``; with ``-printingOptions normal`` only the
    nonzero columns, the others 0)."""
    x, dj, y = np.zeros(num_cols), np.zeros(num_cols), np.zeros(num_rows)
    with open(path) as f:
        head = f.readline().split()
        for line in f:
            parts = line.split()
            if len(parts) < 4:
                continue
            if parts[0] == "**":  # CBC flags infeasible entries
                parts = parts[1:]
            name = parts[1]
            if name[0] == "x":
                j = int(name[1:])
                x[j] = float(parts[2])
                dj[j] = float(parts[3])
            elif name[0] == "c" and num_rows:
                y[int(name[1:])] = float(parts[3])
    if not head:
        return "stopped", None, dj, y
    word = head[0]
    if word == "Optimal":
        return "optimal", x, dj, y
    if word in ("Infeasible", "Integer"):
        return "infeasible", None, dj, y
    # "Stopped on time - objective value v" holds a plan; "Stopped on iterations (no integer
    # solution - continuous used) - ..." (the node limit) holds the LP's values, no plan.
    if word == "Stopped" and "objective" in head and "integer" not in head:
        return "feasible", x, dj, y
    return "stopped", None, dj, y


def _stop_reason(path: str) -> str:
    """Which limit stopped CBC, from its solution file's first line: "time" ("Stopped on
    time"), "nodes" ("Stopped on iterations", which -maxNodes writes) or "" (none)."""
    with open(path) as f:
        head = f.readline().split()
    if head[:1] != ["Stopped"]:
        return ""
    return "time" if "time" in head else "nodes"


def _run_cbc(job: _Job) -> RunResult:
    m, mip, time_limit_s, mip_gap, start, cutoff, max_nodes = job
    with tempfile.TemporaryDirectory(prefix="autoplan-cbc-") as tmp:
        model, sol = os.path.join(tmp, "model.mps"), os.path.join(tmp, "model.sol")
        write_mps(m, model)
        args = [cbc_path(), model]
        if mip and start is not None and cutoff is not None:
            if float(m.cost @ start) + m.offset >= cutoff:
                start = None  # CBC cannot use a start the cutoff rules out
        if mip and start is not None:
            mst = os.path.join(tmp, "start.mst")
            _write_start(start, mst)
            args += ["-mips", mst]
        if time_limit_s is not None:
            args += ["-sec", str(float(time_limit_s))]
        if mip and max_nodes is not None:
            args += ["-maxNodes", str(int(max_nodes))]
        if mip and cutoff is not None:
            # A MIP under a cutoff near its LP bound is a proof that no plan is cheaper (the
            # tied MIP after untying): CBC's preprocessing, root cuts and presolve cost more
            # than the search there.
            args += ["-cutoff", repr(float(cutoff))]
            args += ["-preprocess", "off", "-cuts", "off", "-presolve", "off"]
        # Primal heuristics rarely pay on this ILP (its LP relaxation is nearly integral)
        # and the dual simplex suits its re-solves. For an LP, -dualS is the whole solve: a
        # further -initialSolve would presolve and solve it again from the optimal basis.
        args += ["-heur", "off", "-dualS", "-ratio", str(float(mip_gap))]
        args += ["-solve"] if mip else []
        # An LP's reduced costs and row duals are read for every column and row; a MIP's
        # plan needs only the columns it sets, which CBC's normal printing lists.
        args += ["-printingOptions", "normal" if mip else "all"]
        args += ["-solution", sol]
        # CBC does not always keep to -sec: when the -dualS solve of a MIP's LP stops on
        # time, its -solve then runs unbounded. Past the limit and a grace for writing the
        # solution, it is stopped here.
        wait = None
        if time_limit_s is not None:
            wait = time_limit_s + max(_GRACE_S, 0.1 * time_limit_s)
        began = time.perf_counter()
        code, output = run_owned(args, wait)
        if code is None:
            return RunResult("stopped", None, stopped_by="time")
        ran_out = time_limit_s is not None and time.perf_counter() - began >= time_limit_s
        if code != 0 or not os.path.exists(sol):
            tail = "\n".join(output.splitlines()[-5:])
            raise SolverCrashed(f"CBC ({args[0]}) failed with exit code {code}: {tail}")
        status, x, dj, y = read_cbc_solution(sol, m.num_cols, 0 if mip else m.num_rows)
        stopped_by = _stop_reason(sol)
    if status == "infeasible" and ran_out:
        # CBC's preprocessing, cut short by -sec, can say "Integer infeasible" of a model it
        # has not solved: an answer given once the time was up proves nothing.
        status, stopped_by = "stopped", "time"
    if mip:
        return RunResult(status, x, stopped_by=stopped_by)
    return RunResult(status, x, dj, y=y, stopped_by=stopped_by)
