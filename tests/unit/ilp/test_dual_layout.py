"""The dual ascent's layout: an edge's potentials read by row, column or whole."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoplan.ilp.bound import dual_layout
from autoplan.ilp.bound.dual import Ascent
from autoplan.ilp.bound.dual_layout import rounded_down
from autoplan.ilp.formulation.problem import Problem
from tests.helpers.ilp_problems import moded_problem, random_problem, routed_problem


def _with_gaps(p: Problem, seed: int) -> Problem:
    """``p`` with a few strategies ruled out, so that some groups have none allowed."""
    rng = np.random.default_rng(seed)
    for linear in p.linear.values():
        out = rng.random(len(linear)) < 0.3
        out[int(rng.integers(len(linear)))] = False  # a class keeps a strategy
        linear[out] = math.inf
    return p


def _dense(p: Problem, k: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Edge k's potentials as a dense matrix: prices (rounded down to float32, as the
    ascent keeps them) less both messages between groups an allowed strategy maps to, inf
    elsewhere."""
    e = p.edges[k]
    rows = np.unique(e.src_group[p.allowed(e.src) & (e.src_group >= 0)])
    cols = np.unique(e.dst_group[p.allowed(e.dst) & (e.dst_group >= 0)])
    out = np.full(e.cost.shape, math.inf)
    at = np.ix_(rows, cols)
    out[at] = rounded_down(e.prices(at)) - a[rows][:, None] - b[cols][None, :]
    return out


@pytest.mark.parametrize("chunk", [1, 1 << 16])
@pytest.mark.parametrize("seed", range(10))
def test_potentials_read_by_row_column_or_whole_are_the_dense_potentials(seed, chunk, monkeypatch):
    """The result keeps an edge's compact prices and messages, not its dense potentials:
    every row, column, whole matrix and least per row and column read from them is the
    dense matrix's, to the last bit, on plain, routed and moded edges, some groups with
    no allowed strategy; the least per row and column taken one row at a time or all at
    once."""
    monkeypatch.setattr(dual_layout, "_CHUNK", chunk)
    problems = [random_problem(seed), routed_problem(seed), moded_problem(seed)]
    for p in [*problems, _with_gaps(random_problem(seed), seed)]:
        ascent = Ascent(p)
        ascent.raise_bound()
        dual = ascent.result()
        for k in range(len(p.edges)):
            want, got = _dense(p, k, dual.a[k], dual.b[k]), dual.phi[k]
            np.testing.assert_array_equal(got.full(), want)
            for g in range(want.shape[0]):
                np.testing.assert_array_equal(got.row(g), want[g])
            for h in range(want.shape[1]):
                np.testing.assert_array_equal(got.column(h), want[:, h])
            np.testing.assert_array_equal(got.row_min, want.min(axis=1))
            np.testing.assert_array_equal(got.col_min, want.min(axis=0))
            assert dual.low[k] == want.min()


def test_prices_rounded_down_are_the_float32_at_or_below_each():
    """Every price becomes the largest float32 at or below it (inf stays inf), so a
    potential formed from them never exceeds the exact one."""
    rng = np.random.default_rng(0)
    prices = np.concatenate(
        [rng.random(1000) * 10.0 ** rng.integers(-3, 8, 1000), [0.0, 1.0, 0.1, np.inf]]
    )
    low = rounded_down(prices)
    assert low.dtype == np.float32
    assert (low.astype(np.float64) <= prices).all()
    above = np.nextafter(low, np.float32(np.inf)).astype(np.float64)
    finite = np.isfinite(prices)
    assert (above[finite] > prices[finite]).all()
    assert np.isinf(low[~finite]).all()
