"""Stage 5b (formulation), an edge's compaction kept block diagonal.

Input: a block diagonal price matrix (:class:`~autoplan.cost.block_diagonal.BlockDiagonal`,
an edge between two roots of one layer under its checkpointing modes), the rows and
columns its ends' allowed strategies use, and the class's scale. Output: what
:func:`autoplan.ilp.formulation.problem._compact` makes of a dense matrix (the distinct
used rows and columns, each used one's distinct index) with the kept matrix still
block diagonal; or None where the blocks do not compact alike, and the dense path runs.

Why: the dense compaction of such an edge keeps ``(count - 1) / count`` of its prices
``inf``. Exact: a used row has a finite price in its own block (a dead one was ruled
out before), so no row of one block equals a row of another, and rows of one block are
equal in the matrix exactly when they are in the block; likewise columns. Where every
block uses the same rows and columns and merges them alike, the dense result is these
blocks on the diagonal, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.cost.block_diagonal import BlockDiagonal, Prices
from autoplan.ilp.formulation.distinct import distinct_cols, distinct_rows

__all__ = ["Compacted", "compact_blocks"]


@dataclass(frozen=True)
class Compacted:
    """As the dense compaction gives them: ``row_first`` the used rows kept (positions
    among the used rows), ``row_of`` each used row's kept one; the same for columns;
    ``cost`` the kept prices, unscaled."""

    row_first: np.ndarray
    row_of: np.ndarray
    col_first: np.ndarray
    col_of: np.ndarray
    cost: Prices


def compact_blocks(
    m: BlockDiagonal, rows: np.ndarray, cols: np.ndarray, scale: float
) -> Compacted | None:
    """``m`` restricted to rows ``rows`` and columns ``cols`` (masks over its whole
    shape), equal ones merged (compared times ``scale``), kept block diagonal; None when
    its blocks use different rows or columns or merge them differently."""
    count = len(m.blocks)
    by_block_r, by_block_c = rows.reshape(count, m.rows), cols.reshape(count, m.cols)
    if not ((by_block_r == by_block_r[0]).all() and (by_block_c == by_block_c[0]).all()):
        return None
    whole = bool(by_block_r[0].all() and by_block_c[0].all())
    used = np.ix_(by_block_r[0], by_block_c[0])
    made: dict[int, np.ndarray] = {}  # a block the edge holds twice is compacted once
    partition: tuple[np.ndarray, ...] | None = None
    for b in m.blocks:
        if id(b) in made:
            continue
        sub = b if whole else b[used]
        prices = sub if scale == 1.0 else sub * scale
        row_first, row_of = distinct_rows(prices)
        col_first, col_of = distinct_cols(prices[row_first])
        found = (row_first, row_of, col_first, col_of)
        if partition is None:
            partition = found
        elif not all(np.array_equal(x, y) for x, y in zip(partition, found, strict=True)):
            return None
        merged = len(row_first) < len(sub) or len(col_first) < sub.shape[1]
        made[id(b)] = np.ascontiguousarray(sub[np.ix_(row_first, col_first)]) if merged else sub
    assert partition is not None
    row_first, row_of, col_first, col_of = partition
    kept = [made[id(b)] for b in m.blocks]
    same = all(a is b for a, b in zip(kept, m.blocks, strict=True))
    n_r, n_c = int(by_block_r[0].sum()), int(by_block_c[0].sum())

    def per_block(a: np.ndarray, step: int) -> np.ndarray:
        return np.concatenate([a + k * step for k in range(count)])

    return Compacted(
        per_block(row_first, n_r),
        per_block(row_of, len(row_first)),
        per_block(col_first, n_c),
        per_block(col_of, len(col_first)),
        m if same else BlockDiagonal(tuple(kept)),  # twin edges keep sharing one
    )
