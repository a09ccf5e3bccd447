"""Tests for autoplan.ilp.formulation.matrix and autoplan.ilp.backends: the arrays both
solvers read."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from autoplan.ilp.backends import RunResult, run, write_mps
from autoplan.ilp.bound.incumbent import cost_of, memory_of
from autoplan.ilp.bound.relax import start_vector
from autoplan.ilp.formulation.matrix import Flow, emit
from autoplan.ilp.formulation.problem import Edge, Problem
from autoplan.ilp.solver.solve import solve
from tests.helpers.brute_force import brute_force_problem
from tests.helpers.ilp_problems import ilp_model, random_problem, routed_problem

SOLVERS = ["cbc", "highs"]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("seed", range(25))
def test_emitted_matrix_solves_to_brute_force(seed, solver):
    """Unsimplified random problems (lone-strategy ends, impossible moves, a budget) solve exactly."""
    p = random_problem(seed)
    best = brute_force_problem(p)
    sol = solve(ilp_model(p), solver=solver)
    if not math.isfinite(best):
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.objective_us == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert cost_of(p, sol.choice) == pytest.approx(best, rel=1e-6, abs=1e-6)


def test_random_problems_cover_lone_strategies_and_infeasible_cases():
    """The random cases above include lone-strategy classes on edges and infeasible problems."""
    problems = [random_problem(s) for s in range(25)]
    lone = sum(
        1
        for p in problems
        for e in p.edges
        if len(p.linear[e.src]) == 1 or len(p.linear[e.dst]) == 1
    )
    assert lone >= 5
    assert any(not math.isfinite(brute_force_problem(p)) for p in problems)


def test_lone_strategy_class_has_no_column_and_sets_the_rows_right_hand_side():
    """A one-strategy class is a constant: no column, cost in the offset, 1 on its edge row."""
    p = Problem(
        linear={"a": np.array([3.0]), "b": np.array([1.0, 2.0])},
        memory={},
        edges=[Edge("a", "b", np.array([1]), np.array([0, 1]), np.ones((2, 2)), "a -> b")],
        rep={"a": "a", "b": "b"},
        budget=None,
    )
    em = emit(p)
    assert em.class_cols["a"].tolist() == [-1]
    assert em.fixed == {"a": 0}
    assert em.matrix.offset == 3.0
    # rows: b's one-strategy row, then the edge's two row sums and one column sum
    assert em.matrix.row_lower.tolist() == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("solver", SOLVERS)
def test_lp_relaxation_returns_reduced_costs(solver):
    """The LP run gives values and valid reduced costs: LP bound + d_j never exceeds a plan using j."""
    p = Problem(
        linear={"a": np.array([1.0, 4.0])}, memory={}, edges=[], rep={"a": "a"}, budget=None
    )
    em = emit(p)
    result = run(em.matrix, solver, mip=False, time_limit_s=None, mip_gap=0.0)
    assert result.status == "optimal"
    assert result.x.tolist() == pytest.approx([1.0, 0.0])
    assert 0.0 <= result.dj[1] <= 3.0 + 1e-9  # the plan using column 1 costs 4 = 1 + 3


def test_mps_declares_every_column_once_in_order(tmp_path):
    """The MPS file lists binaries between markers and each column's entries together."""
    p = random_problem(3)
    em = emit(p)
    path = tmp_path / "m.mps"
    write_mps(em.matrix, str(path))
    lines = path.read_text().splitlines()
    body = lines[lines.index("COLUMNS") + 1 : lines.index("RHS")]
    names = [line.split()[0] for line in body if "MARKER" not in line]
    firsts = list(dict.fromkeys(names))
    assert firsts == [f"x{j}" for j in range(em.matrix.num_cols)]
    assert sum(1 for a, b in itertools.pairwise(names) if a != b) == len(firsts) - 1


def _read_mps(path) -> dict:
    """Costs, entries, row bounds, upper bounds and binaries of a free-format MPS file."""
    out = {"kind": {}, "cost": {}, "entry": {}, "rhs": {}, "upper": {}, "int": set()}
    section, marked = "", False
    for line in path.read_text().splitlines():
        if not line.startswith(" "):
            section = line.split()[0]
            continue
        f = line.split()
        if section == "ROWS":
            out["kind"][f[1]] = f[0]
        elif section == "COLUMNS" and "MARKER" in line:
            marked = "INTORG" in line
        elif section == "COLUMNS":
            if f[1] == "obj":
                out["cost"][f[0]] = float(f[2])
            else:
                out["entry"][f[0], f[1]] = float(f[2])
            if marked:
                out["int"].add(f[0])
        elif section == "RHS":
            out["rhs"][f[1]] = float(f[2])
        elif section == "BOUNDS":
            out["upper"][f[2]] = float(f[3])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_mps_file_reads_back_as_the_matrix(seed, tmp_path):
    """Every cost, entry, row bound, upper bound and binary mark in the MPS file is the matrix's, exactly."""
    rng = np.random.default_rng(seed)
    m = emit(random_problem(seed)).matrix
    m.cost[:] = rng.uniform(0.0, 1e6, m.num_cols) / 3.0  # values that need all 17 digits
    m.offset = 1.25 * seed
    path = tmp_path / "m.mps"
    write_mps(m, str(path))
    got = _read_mps(path)
    assert got["cost"] == {f"x{j}": float(c) for j, c in enumerate(m.cost)}
    entries = {}
    for j in range(m.num_cols):
        for k in range(m.start[j], m.start[j + 1]):
            entries[f"x{j}", f"c{m.index[k]}"] = float(m.value[k])
    assert got["entry"] == entries
    assert got["int"] == {f"x{j}" for j in np.flatnonzero(m.integer)}
    assert got["upper"] == {f"x{j}": float(u) for j, u in enumerate(m.upper)}
    for i in range(m.num_rows):
        kind = got["kind"][f"c{i}"]
        rhs = got["rhs"].get(f"c{i}", 0.0)
        lower, upper = (-math.inf, rhs) if kind == "L" else (rhs, math.inf if kind == "G" else rhs)
        assert (lower, upper) == (m.row_lower[i], m.row_upper[i])
    assert -got["rhs"].get("obj", 0.0) == m.offset


@pytest.mark.parametrize("seed", range(6))
def test_mps_file_written_a_few_columns_at_a_time_is_the_file_written_at_once(
    seed, tmp_path, monkeypatch
):
    """Pieces of one, two and five columns (binaries and continuous ones split across
    pieces, the markers between) give the file, byte for byte, that one piece gives."""
    from autoplan.ilp import backends

    mixed = 0
    for m in (emit(random_problem(seed)).matrix, emit(routed_problem(seed)).matrix):
        m.offset = 0.5 * seed
        mixed += 0 < int(m.integer.sum()) < m.num_cols
        texts = []
        for columns in (m.num_cols + 1, 1, 2, 5):
            monkeypatch.setattr(backends, "_MPS_COLUMNS", columns)
            path = tmp_path / f"m{columns}.mps"
            write_mps(m, str(path))
            texts.append(path.read_text())
        assert texts[1:] == texts[:1] * 3
        assert texts[0].count("\n\n") == 0  # no empty line where a piece was empty
    assert mixed


def test_stopped_solver_returning_lp_values_falls_back_to_the_incumbent(monkeypatch):
    """A MIP stopped on time that hands back fractional LP values yields the checked incumbent."""
    from autoplan.ilp.solver import solve as solve_module

    p = next(
        q
        for q in map(random_problem, range(100))
        if q.budget is not None and math.isfinite(brute_force_problem(q))
    )
    model = ilp_model(p)
    real_run = solve_module.run

    def stopped(m, solver, *, mip, **kwargs):
        lp = real_run(m, solver, mip=False, time_limit_s=None, mip_gap=0.0)
        if not mip:
            return lp
        return RunResult("feasible", np.full(m.num_cols, 0.5))  # not a plan

    monkeypatch.setattr(solve_module, "run", stopped)
    sol = solve(model, solver="highs")
    assert sol.status == "time_limit"
    assert math.isfinite(sol.objective_us)
    assert cost_of(p, sol.choice) == pytest.approx(sol.objective_us)
    assert memory_of(p, sol.choice) <= p.budget


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("seed", range(25))
def test_flow_edges_solve_to_brute_force(seed, solver):
    """Route-priced edges laid out as flows over their networks' moves solve exactly, warm start included."""
    p = routed_problem(seed)
    best = brute_force_problem(p)
    model = ilp_model(p)
    sol = solve(model, solver=solver)
    if not math.isfinite(best):
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.objective_us == pytest.approx(best, rel=1e-6, abs=1e-6)
    # the warm start of the optimal plan meets every row and costs what the plan costs
    m = model.emitted.matrix
    x = start_vector(model, {r: sol.choice[r] for r in p.linear})
    activity = np.zeros(m.num_rows)
    for j in range(m.num_cols):
        span = slice(m.start[j], m.start[j + 1])
        activity[m.index[span]] += m.value[span] * x[j]
    assert (activity >= m.row_lower - 1e-9).all() and (activity <= m.row_upper + 1e-9).all()
    assert m.cost @ x + m.offset == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_routed_problems_are_laid_out_as_flows():
    """The cases above do exercise the flow layout (not only the pairwise one)."""
    flows = sum(
        isinstance(cols, Flow) for s in range(25) for cols in emit(routed_problem(s)).edge_cols
    )
    assert flows >= 10


@pytest.mark.parametrize("ran_out", [False, True])
def test_cbc_infeasible_said_once_time_is_up_counts_as_stopped(monkeypatch, ran_out):
    """CBC's "Integer infeasible" proves nothing when it comes at -sec (preprocessing cut short)."""
    from autoplan.ilp import backends

    m = emit(random_problem(0)).matrix
    limit = 0.05

    def fake_cbc(args, wait):
        if ran_out:
            time.sleep(limit)
        with open(args[args.index("-solution") + 1], "w") as f:
            f.write("Integer infeasible - objective value 1.0\n")
        return 0, ""

    monkeypatch.setattr(backends, "run_owned", fake_cbc)
    got = run(m, "cbc", mip=True, time_limit_s=limit if ran_out else 60.0, mip_gap=0.0, cutoff=1.0)
    assert got.status == ("stopped" if ran_out else "infeasible") and got.x is None


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_mip_stopped_at_its_node_limit_says_so(solver):
    """max_nodes stops a MIP that its root does not settle: the run reports stopped_by
    "nodes" (not "time"); with no limit the same MIP is optimal and says nothing."""
    cut = []
    for seed in range(200):
        p = random_problem(seed)
        if p.budget is None or not math.isfinite(brute_force_problem(p)):
            continue
        m = emit(p).matrix
        got = run(m, solver, mip=True, time_limit_s=None, mip_gap=0.0, max_nodes=0)
        if got.status != "optimal":
            assert got.stopped_by == "nodes" and got.status in ("feasible", "stopped")
            whole = run(m, solver, mip=True, time_limit_s=None, mip_gap=0.0)
            assert whole.status == "optimal" and whole.stopped_by == ""
            cut.append(seed)
    assert len(cut) >= 3


def test_cbc_node_limit_with_lp_values_is_no_plan(monkeypatch):
    """CBC's "Stopped on iterations (no integer solution - continuous used)" header, which
    -maxNodes writes, holds LP values: no plan, stopped by nodes."""
    from autoplan.ilp import backends

    m = emit(random_problem(0)).matrix

    def fake_cbc(args, wait):
        assert args[args.index("-maxNodes") + 1] == "7"
        with open(args[args.index("-solution") + 1], "w") as f:
            f.write(
                "Stopped on iterations (no integer solution - continuous used) - objective value 1.0\n"
            )
        return 0, ""

    monkeypatch.setattr(backends, "run_owned", fake_cbc)
    got = run(m, "cbc", mip=True, time_limit_s=None, mip_gap=0.0, max_nodes=7)
    assert (got.status, got.x, got.stopped_by) == ("stopped", None, "nodes")
