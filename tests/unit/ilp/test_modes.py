"""Branching on checkpointing modes before the MIP (autoplan.ilp.solver.modes), against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoplan.ilp.bound.dual import Ascent
from autoplan.ilp.bound.relax import relax
from autoplan.ilp.solver.modes import mode_groups, restrict
from autoplan.ilp.solver.solve import solve
from tests.helpers.brute_force import best_within
from tests.helpers.ilp_problems import ilp_model, moded_problem

SEEDS = range(30)


def _mode(p, r: str, i: int) -> int:
    return i // p.blocks[r][1]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restriction_holds_exactly_the_plans_in_its_mode(seed):
    """restrict(model, group, k): its optimum is the cheapest plan whose group is in mode
    k, its matrix the model's without the other modes' columns."""
    p = moded_problem(seed)
    model = ilp_model(p)
    for members in mode_groups(p).values():
        for k in range(len(p.linear[members[0]]) // p.blocks[members[0]][1]):
            child = restrict(model, members, k)
            want = best_within(
                p, lambda c, members=members, k=k: _mode(p, members[0], c[members[0]]) == k
            )
            if child is None:
                assert not math.isfinite(want)
                continue
            assert child.emitted.matrix.num_rows == model.emitted.matrix.num_rows
            got = solve(child, fixing=False)
            if math.isfinite(want):
                assert got.objective_us == pytest.approx(want, rel=1e-9, abs=1e-9)
            else:
                assert got.status == "infeasible"


@pytest.mark.parametrize("seed", SEEDS)
def test_an_ascent_seeded_from_its_parent_starts_at_its_bound_or_higher(seed):
    """Seeded from the model's own dual, an ascent starts at that bound; a restriction
    seeded from it starts no lower, and its bound holds for its plans."""
    p = moded_problem(seed)
    model = ilp_model(p)
    rel = relax(model)
    if rel.dual is None:
        return
    again = Ascent(p, seed=(rel.dual, p))
    assert again.result().bound == pytest.approx(rel.dual.bound, rel=1e-12, abs=1e-9)
    for members in mode_groups(p).values():
        child = restrict(model, members, 0)
        if child is None:
            continue
        seeded = Ascent(child.reduced, seed=(rel.dual, p))
        start = seeded.result().bound
        assert start >= rel.dual.bound - 1e-9 * max(1.0, abs(rel.dual.bound))
        seeded.raise_bound()
        best = best_within(child.reduced)
        assert seeded.result().bound <= best + 1e-9 * max(1.0, abs(best))
        assert np.isfinite(start)
