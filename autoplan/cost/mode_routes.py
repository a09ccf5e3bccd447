"""Stage 4b, cost (``activation_checkpointing="auto"``): a route network once per mode.

Input: a route :class:`~autoplan.cost.routes.Network` and, per checkpointing mode,
the factor its prices take (2 where the mode computes the edge's consumer again, so
the move is made twice). Output: :class:`ModeRoutes`, the network
:mod:`autoplan.memory.layer_modes` gives an edge into a recomputed node: states ``[0, n)``
the entry, ``[(k+1)n, (k+2)n)`` mode k's copy of the network, each entry state
stepping free into its place in every copy.

Why not a matrix: the distances over ``(modes+1) n`` states are ``(modes+1)^2`` blocks
of the one network's, most of them ``inf``, and are read a few rows and columns at a
time; they are computed from the network's own when asked. Pruning to an edge's
states is likewise the one network's pruning once per copy, shared by the copies that
route between the same states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autoplan.cost.routes import Routes, spreads

__all__ = ["ModeRoutes"]


@dataclass(frozen=True, eq=False)
class ModeRoutes(Routes):
    """``base`` once per mode, its prices times ``scales[k]`` in copy k, behind entry
    states (see the module docstring). From an entry state a, a route reaches copy k's
    state b at ``scales[k] * dist[a, b]``; within copy k at the same; nothing leaves a
    copy or enters the entry but its own start.

    The arcs, per copy k in order: each entry state into copy k (free), then ``base``'s
    moves inside copy k; ``kept`` marks those still in the network (None: all).
    """

    base: Routes
    scales: tuple[float, ...]
    kept: np.ndarray | None = None

    @cached_property
    def states(self) -> tuple:  # type: ignore[override]
        return self.base.states * (len(self.scales) + 1)

    @cached_property
    def _arcs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, own, base = self.base.size, np.arange(self.base.size), self.base
        src, dst, price = [], [], []
        for k, scale in enumerate(self.scales):
            at = (k + 1) * n
            src += [own, base.arc_src + at]
            dst += [own + at, base.arc_dst + at]
            price += [np.zeros(n), base.arc_cost * scale]
        arcs = np.concatenate(src), np.concatenate(dst), np.concatenate(price)
        return arcs if self.kept is None else tuple(a[self.kept] for a in arcs)

    @property
    def arc_src(self) -> np.ndarray:  # type: ignore[override]
        return self._arcs[0]

    @property
    def arc_dst(self) -> np.ndarray:  # type: ignore[override]
        return self._arcs[1]

    @property
    def arc_cost(self) -> np.ndarray:  # type: ignore[override]
        return self._arcs[2]

    def distances(self, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        """Filled block by block: the pairs no route joins (most of them) are never
        priced, and the blocks a route joins are the one network's, scaled."""
        n = self.base.size
        every = np.arange(self.size)
        row_block, row_at = np.divmod(every if rows is None else np.asarray(rows), n)
        col_block, col_at = np.divmod(every if cols is None else np.asarray(cols), n)
        out = np.full((len(row_block), len(col_block)), np.inf)
        entry = np.flatnonzero(row_block == 0)
        # into the entry: from the same entry state only, at no price
        ends = np.flatnonzero(col_block == 0)
        if len(entry) and len(ends):
            same = row_at[entry][:, None] == col_at[ends][None, :]
            out[np.ix_(entry, ends)] = np.where(same, 0.0, np.inf)
        # into a copy: from the entry, or from inside the same copy
        for k, scale in enumerate(self.scales):
            ends = np.flatnonzero(col_block == k + 1)
            starts = np.flatnonzero((row_block == 0) | (row_block == k + 1))
            if len(ends) and len(starts):
                block = self.base.distances(row_at[starts], col_at[ends]) * scale
                out[np.ix_(starts, ends)] = block
        return out

    def least(
        self,
        heads: np.ndarray,
        states: np.ndarray,
        scales: Sequence[float],
        minus: np.ndarray,
        plus: np.ndarray,
        *,
        forward: bool,
    ) -> np.ndarray:
        """By blocks, as :meth:`distances`: between entry states, each with itself; from
        an entry state into copy k and within copy k, ``base``'s, scaled."""
        if spreads(plus - minus):
            return super().least(heads, states, scales, minus, plus, forward=forward)
        n = self.base.size
        head_block, head_at = np.divmod(np.asarray(heads), n)
        block, at = np.divmod(np.asarray(states), n)
        out = np.full(len(block), np.inf)
        entry = head_block == 0
        best = np.full(n, np.inf)
        np.minimum.at(best, head_at[entry], (0.0 - minus[entry]) + plus[entry])
        out[block == 0] = best[at[block == 0]]
        for k, scale in enumerate(self.scales):
            # the route's start may be an entry state: a head's going forward, a state's back
            if forward:
                ours, theirs = block == k + 1, entry | (head_block == k + 1)
            else:
                ours, theirs = (block == 0) | (block == k + 1), head_block == k + 1
            if ours.any() and theirs.any():
                found = self.base.least(
                    head_at[theirs],
                    at[ours],
                    (scale, *scales),
                    minus[theirs],
                    plus[theirs],
                    forward=forward,
                )
                out[ours] = np.minimum(out[ours], found)
        return out

    def with_arcs(self, keep: np.ndarray) -> ModeRoutes:
        kept = np.ones(self._count, dtype=bool) if self.kept is None else self.kept.copy()
        kept[np.flatnonzero(kept)[~keep]] = False
        return ModeRoutes(self.base, self.scales, kept)

    @property
    def _count(self) -> int:
        return len(self.scales) * (self.base.size + len(self.base.arc_src))

    def between(self, sources: np.ndarray, sinks: np.ndarray) -> ModeRoutes:
        """:meth:`Routes.between` by copies: a route into copy k starts at an entry state or
        in copy k and ends in copy k, so copy k keeps ``base``'s moves between those
        states (prices scaled alike), and an entry state's step into copy k stays when it
        is a source that reaches a sink there."""
        n = self.base.size
        src_block, src_at = np.divmod(np.asarray(sources), n)
        snk_block, snk_at = np.divmod(np.asarray(sinks), n)
        entry = src_at[src_block == 0]
        by_states: dict[tuple[bytes, bytes], np.ndarray] = {}
        parts = []
        for k in range(len(self.scales)):
            starts = np.unique(np.concatenate([entry, src_at[src_block == k + 1]]))
            ends = np.unique(snk_at[snk_block == k + 1])
            key = (starts.tobytes(), ends.tobytes())
            if key not in by_states:
                by_states[key] = self.base.on_routes(starts, ends)
            steps = np.zeros(n, dtype=bool)
            if len(ends):
                steps[entry] = np.isfinite(self.base.distances(entry, ends)).any(axis=1)
            parts += [steps, by_states[key]]
        keep = np.concatenate(parts)
        if self.kept is not None:
            keep &= self.kept
        return (
            self if self.kept is None and keep.all() else ModeRoutes(self.base, self.scales, keep)
        )
