"""Distinct rows and columns by their bits (autoplan.ilp.formulation.distinct): the same as
a dict of each row's (column's) bytes, with the real hash and with every hash made to
collide, and the dominance check and the edge compaction built on them unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.ilp.formulation import distinct
from autoplan.ilp.formulation.prune import dominated
from tests.helpers.brute_force import dominated_rows


def _by_dict(a: np.ndarray) -> tuple[list[int], list[int]]:
    seen: dict[bytes, int] = {}
    firsts, of = [], []
    for k, row in enumerate(np.ascontiguousarray(a, dtype=np.float64)):
        if row.tobytes() not in seen:
            seen[row.tobytes()] = len(firsts)
            firsts.append(k)
        of.append(seen[row.tobytes()])
    return firsts, of


def _matrix(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.choice([0.0, 1.0, 2.0, np.inf], (50, 9), p=[0.4, 0.3, 0.2, 0.1])
    f[20:30] = f[:10]  # repeated rows
    f[40] = f[0]
    f[40, 0] = -0.0 if f[0, 0] == 0.0 else f[40, 0]  # equal in value, not in bits
    f[41] = f[0]
    return f


@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_distinct_rows_equal_a_dict_of_their_bytes(seed, collide, monkeypatch):
    """Where each distinct row first appears and each row's index among them, as a dict
    of the rows' bytes finds them; with every hash made to collide too (the rows that
    hash alike are checked, and then compared by their bytes)."""
    if collide:
        monkeypatch.setattr(distinct, "_row_hashes", lambda bits: np.zeros(len(bits), np.uint64))
    for a in (_matrix(seed), _matrix(seed).T, np.zeros((0, 3)), np.zeros((4, 0))):
        firsts, of = distinct.distinct_rows(a)
        expected_firsts, expected_of = _by_dict(a)
        np.testing.assert_array_equal(firsts, expected_firsts)
        np.testing.assert_array_equal(of, expected_of)


@pytest.mark.parametrize("seed", range(4))
def test_dominance_over_repeated_rows_whatever_the_hash(seed, monkeypatch):
    """The rows dominated are those the full comparison finds, with the real hash and
    with every hash colliding (0.0 and -0.0 rows: equal prices, the earlier stays)."""
    f = _matrix(seed)
    expected = dominated_rows(f)
    np.testing.assert_array_equal(dominated(f, probe=6, chunk=8), expected)
    monkeypatch.setattr(distinct, "_row_hashes", lambda bits: np.zeros(len(bits), np.uint64))
    np.testing.assert_array_equal(dominated(f, probe=6, chunk=8), expected)


@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_distinct_columns_equal_the_distinct_rows_of_the_transpose(seed, collide, monkeypatch):
    """Columns hashed in place give what the rows of the transposed matrix give: where
    each distinct column first appears and each column's index among them, with every
    hash made to collide too."""
    if collide:
        monkeypatch.setattr(
            distinct, "_col_hashes", lambda bits: np.zeros(bits.shape[1], np.uint64)
        )
    for a in (_matrix(seed), _matrix(seed).T, np.zeros((0, 3)), np.zeros((4, 0))):
        firsts, of = distinct.distinct_cols(a)
        expected_firsts, expected_of = _by_dict(np.asarray(a).T)
        np.testing.assert_array_equal(firsts, expected_firsts)
        np.testing.assert_array_equal(of, expected_of)
