"""Lazy route networks: route prices found when asked, over the near moves alone.

Stage 4, cost (built by :class:`~autoplan.cost.router.Router` on meshes of four axes or
more). Input: a network's states and its priced moves (the near moves of
:mod:`autoplan.cost.near_moves` between its waypoints, and every move into and out of the
edges' own placements). Output: a :class:`~autoplan.cost.routes.Routes` whose
:meth:`~LazyNetwork.distances` runs Dijkstra's algorithm (scipy's csgraph) from the
states asked for, forward from sources or backward from sinks, and keeps each row;
:meth:`~LazyNetwork.least` (what the column prices read: per state, the least route
price plus an offset over many sources) runs one search from a state added before them.

Why: a :class:`~autoplan.cost.routes.Network` closes all pairs (Floyd-Warshall, n passes
over n x n), and on a 4-D mesh n is 1 296 to 2 401; the planner asks for the prices from
an edge's rows and to its columns, tens of states per network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import dijkstra

from autoplan.core.placements import Placements
from autoplan.cost.routes import Routes, spreads

__all__ = ["LazyNetwork", "Prices"]


class Prices:
    """Cheapest route prices over a fixed set of moves, by rows and by columns, each
    found once (every :class:`LazyNetwork` of one network shares them)."""

    def __init__(self, size: int, src: np.ndarray, dst: np.ndarray, cost: np.ndarray) -> None:
        # explicit entries, zeros included, are moves: a free move stays one
        self._forward = csr_array((cost, (src, dst)), shape=(size, size))
        self._backward = csr_array((cost, (dst, src)), shape=(size, size))
        self._rows: dict[int, np.ndarray] = {}
        self._cols: dict[int, np.ndarray] = {}
        self._before: dict[int, np.ndarray] = {}  # per source: each state's predecessor

    def from_states(self, rows: np.ndarray) -> np.ndarray:
        """(rows, every state): the price from each of ``rows``."""
        return self._found(self._forward, self._rows, rows, self._before)

    def to_states(self, cols: np.ndarray) -> np.ndarray:
        """(every state, cols): the price to each of ``cols``."""
        return self._found(self._backward, self._cols, cols, None).T

    def searched_from(self, rows: np.ndarray) -> bool:
        """Whether the search from every one of ``rows`` is kept."""
        return all(map(self._rows.__contains__, np.asarray(rows).tolist()))

    def searched_to(self, cols: np.ndarray) -> bool:
        """Whether the search toward every one of ``cols`` is kept."""
        return all(map(self._cols.__contains__, np.asarray(cols).tolist()))

    def least(self, forward: bool, heads: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per state, the least over ``i`` of ``weights[i]`` (finite, >= 0) plus the price
        from ``heads[i]`` (``forward``) or to it: one search, from a state added with a
        move of price ``weights[i]`` into each ``heads[i]``, not one per head."""
        graph = self._forward if forward else self._backward
        n = graph.shape[0]
        first = np.full(n, np.inf)
        np.minimum.at(first, heads, weights)
        at = np.flatnonzero(np.isfinite(first))
        indptr = np.append(graph.indptr, graph.indptr[-1] + len(at))
        indices = np.concatenate([graph.indices, at.astype(graph.indices.dtype)])
        added = csr_array(
            (np.concatenate([graph.data, first[at]]), indices, indptr), (n + 1, n + 1)
        )
        return dijkstra(added, directed=True, indices=n)[:n]

    def search_from(self, rows: np.ndarray) -> None:
        """Run the searches from ``rows`` not run yet, in one call, and keep them."""
        self._search(self._forward, self._rows, np.asarray(rows, dtype=np.int64), self._before)

    def before(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per row of ``rows``: per state, the state before it on the cheapest route from
        the row that Dijkstra's search found (negative: the row itself, or not reached)."""
        self.search_from(rows)
        return [self._before[row] for row in np.asarray(rows).tolist()]

    @staticmethod
    def _search(
        graph: csr_array,
        kept: dict[int, np.ndarray],
        ends: np.ndarray,
        before: dict[int, np.ndarray] | None,
    ) -> None:
        missing = np.unique([e for e in ends.tolist() if e not in kept])
        if len(missing):
            found, came = dijkstra(graph, directed=True, indices=missing, return_predecessors=True)
            kept.update(zip(missing.tolist(), np.atleast_2d(found), strict=True))
            if before is not None:
                before.update(zip(missing.tolist(), np.atleast_2d(came), strict=True))

    @classmethod
    def _found(
        cls,
        graph: csr_array,
        kept: dict[int, np.ndarray],
        ends: np.ndarray,
        before: dict[int, np.ndarray] | None,
    ) -> np.ndarray:
        ends = np.asarray(ends, dtype=np.int64)
        cls._search(graph, kept, ends, before)
        if not len(ends):
            return np.zeros((0, graph.shape[0]))
        return np.stack([kept[e] for e in ends.tolist()])


@dataclass(frozen=True, eq=False)
class LazyNetwork(Routes):
    """A route network whose prices are found when asked (see the module docstring).
    ``prices`` holds the prices over every move of the network; :meth:`with_arcs` keeps
    them and narrows only the arcs a route may take."""

    states: tuple[Placements, ...]
    arc_src: np.ndarray
    arc_dst: np.ndarray
    arc_cost: np.ndarray
    prices: Prices = field(repr=False)

    @staticmethod
    def of(
        states: tuple[Placements, ...], src: np.ndarray, dst: np.ndarray, cost: np.ndarray
    ) -> LazyNetwork:
        """The network of these moves: the finite ones between two different states, the
        cheapest of those with the same ends."""
        keep = np.flatnonzero(np.isfinite(cost) & (src != dst))
        key = src[keep] * len(states) + dst[keep]
        order = np.lexsort((cost[keep], key))
        first = np.ones(len(order), dtype=bool)
        first[1:] = key[order][1:] != key[order][:-1]
        keep = keep[order[first]]
        src, dst, cost = src[keep], dst[keep], cost[keep]
        return LazyNetwork(states, src, dst, cost, Prices(len(states), src, dst, cost))

    def distances(self, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        # from a side whose searches are all kept (narrowing searched from every edge's
        # rows), else from the side of fewer distinct states: one Dijkstra each
        prices = self.prices
        if rows is not None and prices.searched_from(rows):
            forward = True
        elif cols is not None and prices.searched_to(cols):
            forward = False
        else:
            forward = cols is None or (
                rows is not None and len(np.unique(rows)) <= len(np.unique(cols))
            )
        if forward:
            out = self.prices.from_states(np.arange(self.size) if rows is None else rows)
            return out if cols is None else out[:, cols]
        assert cols is not None
        out = self.prices.to_states(cols)
        return out if rows is None else out[rows]

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
        offset = plus - minus
        found = None if spreads(offset) else self._least(forward, heads, scales, offset)
        if found is None:
            return super().least(heads, states, scales, minus, plus, forward=forward)
        return found[states]

    def _least(
        self, forward: bool, heads: np.ndarray, scales: Sequence[float], offset: np.ndarray
    ) -> np.ndarray | None:
        """Per state, the least over ``i`` of the price from ``heads[i]`` (``forward``)
        or to it, scaled, plus ``offset[i]``: one search (:meth:`Prices.least`), the
        offsets (neither NaN nor ``-inf``) shifted to be >= 0. None when the scale is not
        positive."""
        scale = math.prod(scales)
        if not 0 < scale < math.inf:
            return None
        per_price = offset / scale
        ok = np.isfinite(per_price)
        if not ok.any():
            return np.full(self.size, np.inf)
        low = per_price[ok].min()
        found = self.prices.least(forward, heads[ok], per_price[ok] - low)
        return (found + low) * scale

    def with_arcs(self, keep: np.ndarray) -> LazyNetwork:
        return LazyNetwork(
            self.states, self.arc_src[keep], self.arc_dst[keep], self.arc_cost[keep], self.prices
        )

    def on_routes(self, sources: np.ndarray, sinks: np.ndarray) -> np.ndarray:
        """Per arc, whether it lies on the cheapest route Dijkstra's search found from a
        source to a sink: one route per pair, walked back from the sinks. Every pair keeps
        a cheapest route, and the test costs sources x sinks x hops, not sources x arcs
        (a lazy network has a hundred thousand arcs and more). The searches are kept, so
        a network narrowed so keeps the same routes for any of its sources and sinks."""
        n = self.size
        marked = []
        starts = np.unique(sources)
        sinks = np.asarray(sinks, dtype=np.int64)
        for s, came in zip(starts.tolist(), self.prices.before(starts), strict=True):
            # the states on a route to a sink, the source left out; each enters its arc
            on = np.zeros(n, dtype=bool)
            at = sinks[came[sinks] >= 0]
            while len(at):
                on[at] = True
                prev = came[at]
                at = prev[prev != s]
                at = at[~on[at]]
            states = np.flatnonzero(on)
            if len(states):
                marked.append(came[states].astype(np.int64) * n + states)
        keep = np.zeros(len(self.arc_src), dtype=bool)
        if not marked:
            return keep
        key = self.arc_src * n + self.arc_dst
        order = np.argsort(key)
        wanted = np.unique(np.concatenate(marked))
        at = np.minimum(np.searchsorted(key[order], wanted), len(key) - 1)
        if not (key[order][at] == wanted).all():  # a route's move narrowed away earlier
            return super().on_routes(sources, sinks)
        keep[order[at]] = True
        return keep

    @cached_property
    def _out(self) -> csr_array:
        """This network's arcs by source state: (state, state) -> index of the arc + 1."""
        at = np.arange(1, len(self.arc_src) + 1)
        return csr_array((at, (self.arc_src, self.arc_dst)), shape=(self.size, self.size))

    @cached_property
    def _move_list(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The arcs by source state and their own prices (an arc here need not be a
        cheapest route between its ends)."""
        out = self._out
        src = np.repeat(np.arange(self.size), np.diff(out.indptr))
        return src, out.indices, self.arc_cost[out.data - 1]
