"""Tests for autoplan.ilp: build_ilp + solve against brute force on tiny random graphs.

Every random case is small enough (at most 4**6 strategy combinations) to
enumerate, so the ILP's optimum is checked exactly, not bounded.
"""

import math

import numpy as np
import pytest

from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.formulation.problem import InfeasibleError
from autoplan.ilp.solver.solve import solve
from tests.helpers.brute_force import brute_force, combos, footprint
from tests.helpers.ilp_problems import random_costs

APPROX = {"rel": 1e-6, "abs": 1e-6}


def test_an_ilp_moved_to_a_smaller_budget_is_the_one_built_for_it():
    """IlpModel.with_budget (the transient's re-solve) gives the matrix build_ilp makes
    under the smaller budget, and the brute-force optimum there; None where it cannot:
    a larger budget, one below every footprint, or no memory row to move."""
    moved_any = 0
    for seed in range(16):
        costs = random_costs(seed, memory=True)
        footprints = sorted({footprint(costs, c) for c in combos(costs)})
        try:
            built = [build_ilp(costs, memory_budget_bytes=f) for f in footprints]
        except InfeasibleError:
            continue  # an edge no placement pair can take
        n = len(footprints)
        for high, low in {(n - 1, n // 2), (n - 2, n // 3), (n // 2, n // 4), (n // 2, 0)}:
            first = built[high]
            moved = first.with_budget(footprints[low])
            if moved is None:
                has_row = np.isneginf(first.emitted.matrix.row_lower).any()
                assert not has_row or built[low].infeasible
                continue
            moved_any += 1
            assert first.reduced.budget == footprints[high]  # the first stays as it was
            want = built[low].emitted.matrix
            for name in ("cost", "row_lower", "start", "index", "value", "upper"):
                np.testing.assert_array_equal(
                    getattr(moved.emitted.matrix, name), getattr(want, name)
                )
            np.testing.assert_allclose(moved.emitted.matrix.row_upper, want.row_upper)
            sol, best = solve(moved, solver="cbc"), brute_force(costs, budget=footprints[low])
            if math.isfinite(best):
                assert sol.objective_us == pytest.approx(best, **APPROX)
            else:
                assert sol.status == "infeasible"
            assert first.with_budget(footprints[-1] + 1) is None
            assert first.with_budget(footprints[0] - 1) is None
    assert moved_any >= 12
