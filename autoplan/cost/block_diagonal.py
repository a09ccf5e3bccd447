"""A price matrix that is finite only on diagonal blocks, kept as its blocks.

Input: the blocks (each ``(rows, cols)``, one per checkpointing mode of an edge whose
two ends are in one layer, :mod:`autoplan.memory.layer_modes`). Output: a
:class:`BlockDiagonal` that reads as the matrix they make, with ``inf`` outside them.

Why: an edge between a layer's roots is priced per pair of modes, and two different
modes are never both chosen in one layer: stored dense, ``(count - 1) / count`` of its
prices are ``inf``, and two of its blocks equal the layer's own matrix doubled or not.
Kept as blocks, a mode that does not recompute the edge's end holds the unmoded matrix
itself, and the doubled one is one array for every mode that does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BlockDiagonal", "Prices", "live", "taken"]


class BlockDiagonal:
    """The matrix ``blocks[0] (+) blocks[1] (+) ...``: entry ``(i, j)`` is
    ``blocks[k][i - k*rows, j - k*cols]`` when both lie in block ``k``, else ``inf``.
    Read-only: its blocks may be other tables' arrays."""

    ndim = 2

    def __init__(self, blocks: tuple[np.ndarray, ...]) -> None:
        shapes = {b.shape for b in blocks}
        assert blocks and len(shapes) == 1, "blocks of one shape"
        self.blocks = blocks
        self.rows, self.cols = blocks[0].shape
        self.shape = (len(blocks) * self.rows, len(blocks) * self.cols)
        self.dtype = blocks[0].dtype
        self.size = self.shape[0] * self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        """As numpy indexes the dense matrix, for what the ILP asks: rows ``[i]`` and
        ``[i, :]``, columns ``[:, j]`` (``i``, ``j`` ints or index arrays), entries at
        broadcast index arrays ``[i, j]`` (``np.ix_`` included), all of it ``[...]``; a
        new array."""
        if index is Ellipsis:
            return np.asarray(self)
        if not isinstance(index, tuple):
            index = (index, slice(None))
        i, j = index
        if isinstance(j, slice):  # rows: each index in i, then every column
            i = np.asarray(i)[..., None]
            j = np.arange(self.shape[1])[j]
        elif isinstance(i, slice):  # columns: every row, then each index in j
            j = np.asarray(j)
            i = np.arange(self.shape[0])[i].reshape((-1,) + (1,) * j.ndim)
        return self._at(np.asarray(i), np.asarray(j))

    def _at(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        i, j = np.broadcast_arrays(i, j)
        out = np.full(i.shape, np.inf, dtype=self.dtype)
        block_i, local_i = np.divmod(i, self.rows)
        block_j, local_j = np.divmod(j, self.cols)
        for k, b in enumerate(self.blocks):
            at = (block_i == k) & (block_j == k)
            out[at] = b[local_i[at], local_j[at]]
        return out

    def live(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which rows have a finite price in a column of ``cols`` (a mask), and which
        columns one in a row of ``rows``."""
        row_live = np.zeros(self.shape[0], dtype=bool)
        col_live = np.zeros(self.shape[1], dtype=bool)
        for k, b in enumerate(self.blocks):
            r = slice(k * self.rows, (k + 1) * self.rows)
            c = slice(k * self.cols, (k + 1) * self.cols)
            finite = np.isfinite(b) & rows[r, None] & cols[None, c]
            row_live[r], col_live[c] = finite.any(axis=1), finite.any(axis=0)
        return row_live, col_live

    def taken(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The dense matrix of rows ``rows`` and columns ``cols`` (masks), in order."""
        at_r, at_c = np.flatnonzero(rows), np.flatnonzero(cols)
        out = np.full((len(at_r), len(at_c)), np.inf, dtype=self.dtype)
        for k, b in enumerate(self.blocks):
            in_r = (at_r >= k * self.rows) & (at_r < (k + 1) * self.rows)
            in_c = (at_c >= k * self.cols) & (at_c < (k + 1) * self.cols)
            if in_r.any() and in_c.any():
                local = np.ix_(at_r[in_r] - k * self.rows, at_c[in_c] - k * self.cols)
                out[np.ix_(in_r, in_c)] = b[local]
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        everything = np.ones(self.shape[0], bool), np.ones(self.shape[1], bool)
        out = self.taken(*everything)
        return out if dtype is None else out.astype(dtype)


Prices = np.ndarray | BlockDiagonal  # an edge's price matrix


def live(prices: Prices, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``prices`` have a finite price in a column of ``cols`` (a mask), and
    which columns one in a row of ``rows``."""
    if isinstance(prices, BlockDiagonal):
        return prices.live(rows, cols)
    finite = np.isfinite(prices) & rows[:, None] & cols[None, :]
    return finite.any(axis=1), finite.any(axis=0)


def taken(prices: Prices, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The dense matrix of ``prices``' rows ``rows`` and columns ``cols`` (masks): ``prices``
    itself when it is dense and both keep everything (not to be written)."""
    if isinstance(prices, BlockDiagonal):
        return prices.taken(rows, cols)
    return prices if rows.all() and cols.all() else prices[np.ix_(rows, cols)]
