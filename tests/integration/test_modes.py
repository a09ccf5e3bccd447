"""Branching on checkpointing modes before the MIP (autoplan.ilp.solver.modes), against brute force."""

from __future__ import annotations

import math

import pytest

from autoplan.ilp.solver import modes as modes_module
from autoplan.ilp.solver import solve as solve_module
from autoplan.ilp.solver.solve import solve
from tests.helpers.brute_force import best_within
from tests.helpers.ilp_problems import ilp_model, moded_problem

SEEDS = range(30)


def test_the_cases_branch_and_prune(monkeypatch):
    """The random cases do exercise the branching: branches are made, and more of them
    than MIPs run (the others were pruned by their bound)."""
    counts = {"branches": 0, "mips": 0}

    def counting(module, name, key):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    counting(modes_module, "restrict", "branches")
    counting(solve_module, "_mip", "mips")
    for seed in SEEDS:
        solve(ilp_model(moded_problem(seed)))
    assert counts["branches"] >= 30 and counts["mips"] < counts["branches"]


@pytest.mark.parametrize("solver", ["cbc", "highs"])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_branching_on_modes_reaches_the_optimum(seed, solver):
    """solve() with modes in the problem gives brute force's optimum, proved."""
    p = moded_problem(seed)
    best = best_within(p)
    sol = solve(ilp_model(p), solver=solver)
    if not math.isfinite(best):
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.objective_us == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert sol.bound_us == pytest.approx(best, rel=1e-9, abs=1e-9)
