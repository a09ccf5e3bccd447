"""Distinct rows (or columns) of a price matrix, found by hashing their bits.

Stage 5 (formulation), used where edges are compacted
(:func:`~autoplan.ilp.formulation.problem.simplify`) and where strategies are compared
for dominance (:mod:`autoplan.ilp.formulation.prune`). Input: a 2-D array of prices.
Output: where each distinct row (bit for bit) first appears, in order, and each row's
index among them.

Why: a 4-D run compacts and compares thousands of matrices of thousands of rows, many of
them repeats. A dict of each row's bytes is a Python loop that holds the GIL while the
pruning's other worker thread waits; a hash of the bits times fixed weights is one
matrix product in numpy. Rows that hash alike are checked equal before they are merged,
so a collision costs time, never a wrong merge. Columns are hashed in place (a weighted
sum down each column), not as the rows of a transposed copy: on a 4-D mesh the copy
there and back costs more than the hashing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["distinct_cols", "distinct_rows"]

# Rows compared at once when checking that rows of one hash are equal: small temporaries.
_CHECKED = 128


def distinct_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(firsts, of): the index of each distinct row of ``a`` (bit for bit: 0.0 and -0.0
    differ) where it first appears, ascending, and per row the index of its own among
    them."""
    bits = np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)
    _, first, inverse = np.unique(_row_hashes(bits), return_index=True, return_inverse=True)
    same = first[inverse.ravel()]  # per row, the first row of its hash
    dup = np.flatnonzero(same != np.arange(len(a)))
    for lo in range(0, len(dup), _CHECKED):
        rows = dup[lo : lo + _CHECKED]
        if not np.array_equal(bits[rows], bits[same[rows]]):  # a collision: by bytes
            return _by_bytes(bits)
    firsts = np.sort(first)
    return firsts, np.searchsorted(firsts, same)


def distinct_cols(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_rows` of ``a``'s columns: the index of each distinct column where it
    first appears, ascending, and per column the index of its own among them."""
    bits = np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)
    _, first, inverse = np.unique(_col_hashes(bits), return_index=True, return_inverse=True)
    same = first[inverse.ravel()]  # per column, the first column of its hash
    dup = np.flatnonzero(same != np.arange(bits.shape[1]))
    for lo in range(0, len(dup), _CHECKED):
        cols = dup[lo : lo + _CHECKED]
        if not np.array_equal(bits[:, cols], bits[:, same[cols]]):  # a collision: by bytes
            return _by_bytes(np.ascontiguousarray(bits.T))
    firsts = np.sort(first)
    return firsts, np.searchsorted(firsts, same)


def _row_hashes(bits: np.ndarray) -> np.ndarray:
    """Per row of ``bits`` (uint64), the sum of its entries times fixed odd weights,
    modulo 2**64: equal rows hash equal."""
    width = bits.shape[1]
    weights = np.random.default_rng(width).integers(1, 2**63, width, dtype=np.uint64)
    return bits @ (weights | np.uint64(1))


def _col_hashes(bits: np.ndarray) -> np.ndarray:
    """Per column of ``bits`` (uint64), the sum of its entries times fixed odd weights,
    modulo 2**64, summed down the column in place: equal columns hash equal."""
    height = bits.shape[0]
    weights = np.random.default_rng(height).integers(1, 2**63, height, dtype=np.uint64)
    return np.einsum("i,ij->j", weights | np.uint64(1), bits)


def _by_bytes(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_rows` by a dict of each row's bytes."""
    seen: dict[bytes, int] = {}
    of = np.empty(len(bits), dtype=np.int64)
    for k, row in enumerate(bits):
        of[k] = seen.setdefault(row.tobytes(), len(seen))
    return np.unique(of, return_index=True)[1], of  # ids are numbered in first-seen order
