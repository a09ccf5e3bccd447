"""cost.block_diagonal: a block diagonal price matrix reads as its dense matrix."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.block_diagonal import BlockDiagonal, live, taken


def _blocks(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        b = rng.uniform(0, 10, (4, 5))
        b[rng.random(b.shape) < 0.3] = np.inf  # some moves that cannot run
        out.append(b)
    return tuple(out)


def _dense(blocks: tuple[np.ndarray, ...]) -> np.ndarray:
    r, c = blocks[0].shape
    out = np.full((len(blocks) * r, len(blocks) * c), np.inf)
    for k, b in enumerate(blocks):
        out[k * r : (k + 1) * r, k * c : (k + 1) * c] = b
    return out


def test_reads_as_the_dense_matrix_by_every_index_the_ilp_uses():
    """Rows, columns, pairwise index arrays and np.ix_ give the dense matrix's entries."""
    blocks = _blocks()
    m, want = BlockDiagonal(blocks), _dense(blocks)
    assert m.shape == want.shape == (12, 15) and len(m) == 12
    np.testing.assert_array_equal(np.asarray(m), want)
    for i in (0, 5, 11):
        np.testing.assert_array_equal(m[i], want[i])
        np.testing.assert_array_equal(m[:, i], want[:, i])
    rng = np.random.default_rng(1)
    i, j = rng.integers(0, 12, 40), rng.integers(0, 15, 40)
    np.testing.assert_array_equal(m[i, j], want[i, j])
    assert float(m[4, 5]) == want[4, 5] and m[0, 14] == np.inf
    rows, cols = rng.integers(0, 12, 7), rng.integers(0, 15, 9)
    np.testing.assert_array_equal(m[np.ix_(rows, cols)], want[np.ix_(rows, cols)])


@pytest.mark.parametrize("seed", range(4))
def test_live_rows_and_taken_submatrix_match_the_dense_ones(seed):
    """live() and taken() give what the dense matrix's finite mask and np.ix_ give."""
    blocks = _blocks(seed)
    m, want = BlockDiagonal(blocks), _dense(blocks)
    rng = np.random.default_rng(seed)
    rows, cols = rng.random(12) < 0.6, rng.random(15) < 0.6
    for got_r, want_r in zip(live(m, rows, cols), live(want, rows, cols), strict=True):
        np.testing.assert_array_equal(got_r, want_r)
    finite = np.isfinite(want) & rows[:, None] & cols[None, :]
    np.testing.assert_array_equal(live(want, rows, cols)[0], finite.any(axis=1))
    np.testing.assert_array_equal(taken(m, rows, cols), want[np.ix_(rows, cols)])
    every = np.ones(12, bool), np.ones(15, bool)
    assert taken(want, *every) is want  # a dense matrix kept whole is not copied
