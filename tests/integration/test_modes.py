"""Branching on checkpointing modes before the MIP (autoplan.ilp.solver.modes), against brute force."""

from __future__ import annotations

from autoplan.ilp.solver import modes as modes_module
from autoplan.ilp.solver import solve as solve_module
from autoplan.ilp.solver.solve import solve
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
