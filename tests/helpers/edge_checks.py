"""``check_pairs``: an edge's price matrix compared, pair by pair, with per-pair prices."""

from __future__ import annotations

from autoplan.core.placements import fmt


def check_pairs(fast, rows, cols, shape, dtype_bytes, refs, pairs, what) -> None:
    for r, c in pairs:
        for ref in refs:
            want = ref.cost_us(rows[r], cols[c], shape, dtype_bytes)
            # Bitwise, inf where inf: the sums run step after step in cost_us's order.
            assert fast[r, c] == want, f"{what}: {fmt(rows[r])} -> {fmt(cols[c])}"
