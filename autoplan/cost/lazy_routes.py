"""Lazy route networks: route prices found when asked, over the near moves alone.

Stage 4, cost (built by :class:`~autoplan.cost.router.Router` on meshes of four axes or
more). Input: a network's states and its priced moves (the near moves of
:mod:`autoplan.cost.near_moves` between its waypoints, and every move into and out of the
edges' own placements). Output: a :class:`~autoplan.cost.routes.Routes` whose
:meth:`~LazyNetwork.distances` runs Dijkstra's algorithm (scipy's csgraph) from the
states asked for, forward from sources or backward from sinks, and keeps each row (a
call from many states first leaves out the moves a route of two beats);
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
        self._size = size
        # the moves, until those a route of two beats are left out (then None)
        self._untrimmed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = (src, dst, cost)
        self._forward, self._backward = _graphs(size, src, dst, cost)
        self._rows: dict[int, np.ndarray] = {}
        self._cols: dict[int, np.ndarray] = {}
        self._before: dict[int, np.ndarray] = {}  # per source: each state's predecessor
        self._after: dict[int, np.ndarray] = {}  # per sink: each state's successor

    def from_states(self, rows: np.ndarray) -> np.ndarray:
        """(rows, every state): the price from each of ``rows``."""
        return self._found(True, rows)

    def to_states(self, cols: np.ndarray) -> np.ndarray:
        """(every state, cols): the price to each of ``cols``."""
        return self._found(False, cols).T

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
        self._search(True, np.asarray(rows, dtype=np.int64))

    def before(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per row of ``rows``: per state, the state before it on the cheapest route from
        the row that Dijkstra's search found (negative: the row itself, or not reached)."""
        self.search_from(rows)
        return [self._before[row] for row in np.asarray(rows).tolist()]

    def after(self, cols: np.ndarray) -> list[np.ndarray]:
        """Per column of ``cols``: per state, the state after it on the cheapest route to
        the column that the search toward it found (negative: the column, or not
        reached)."""
        self._search(False, np.asarray(cols, dtype=np.int64))
        return [self._after[col] for col in np.asarray(cols).tolist()]

    def _search(self, forward: bool, ends: np.ndarray) -> None:
        """Search from (``forward``) or toward each of ``ends`` not searched yet, in one
        call. A call from a quarter of the states or more first leaves out the moves a
        route of two beats (:func:`_beaten`): found once, that saves in every search."""
        kept = self._rows if forward else self._cols
        missing = np.unique([e for e in ends.tolist() if e not in kept])
        if not len(missing):
            return
        if self._untrimmed is not None and len(missing) * _TRIM_SHARE >= self._size:
            src, dst, cost = self._untrimmed
            keep = ~_beaten(self._size, src, dst, cost)
            self._forward, self._backward = _graphs(self._size, src[keep], dst[keep], cost[keep])
            self._untrimmed = None
        graph = self._forward if forward else self._backward
        found, came = dijkstra(graph, directed=True, indices=missing, return_predecessors=True)
        kept.update(zip(missing.tolist(), np.atleast_2d(found), strict=True))
        trees = self._before if forward else self._after
        trees.update(zip(missing.tolist(), np.atleast_2d(came), strict=True))

    def _found(self, forward: bool, ends: np.ndarray) -> np.ndarray:
        ends = np.asarray(ends, dtype=np.int64)
        self._search(forward, ends)
        if not len(ends):
            return np.zeros((0, self._size))
        kept = self._rows if forward else self._cols
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
        if self._from_rows(rows, cols):
            out = self.prices.from_states(np.arange(self.size) if rows is None else rows)
            return out if cols is None else out[:, cols]
        assert cols is not None
        out = self.prices.to_states(cols)
        return out if rows is None else out[rows]

    def _from_rows(self, rows: np.ndarray | None, cols: np.ndarray | None) -> bool:
        """Whether to search from ``rows`` (None: every state) rather than toward
        ``cols``: from a side whose searches are all kept (narrowing searched from every
        edge's rows), else from the side of fewer distinct states, one Dijkstra each."""
        if rows is not None and self.prices.searched_from(rows):
            return True
        if cols is not None and self.prices.searched_to(cols):
            return False
        return cols is None or (rows is not None and len(np.unique(rows)) <= len(np.unique(cols)))

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
        source to a sink: one route per pair, walked from its far end to the end searched
        from (the sources, or toward the sinks when those are fewer, or were searched
        already). Every pair keeps a cheapest route, and the test costs sources x sinks x
        hops, not sources x arcs (a lazy network has a hundred thousand arcs and more).
        The searches are kept, so a network narrowed so keeps the same routes for any of
        its sources and sinks."""
        n = self.size
        starts = np.unique(np.asarray(sources, dtype=np.int64))
        ends = np.unique(np.asarray(sinks, dtype=np.int64))
        prices = self.prices
        forward = self._from_rows(starts, ends)
        roots, leaves = (starts, ends) if forward else (ends, starts)
        trees = prices.before(roots) if forward else prices.after(roots)
        came = np.stack(trees) if len(trees) else np.zeros((0, n), dtype=np.int64)
        # every tree's walks at once: (tree, state) pairs; came[tree, state] is the next
        # state toward the tree's root, the root's own entry negative
        on = np.zeros(came.shape, dtype=bool)
        row, at = np.nonzero(came[:, leaves] >= 0)
        at = leaves[at]
        while len(row):
            on[row, at] = True
            nxt = came[row, at]
            step = (nxt >= 0) & (nxt != roots[row])
            row, at = row[step], nxt[step]
            fresh = ~on[row, at]
            row, at = row[fresh], at[fresh]
        row, states = np.nonzero(on)
        entered = np.zeros((n, n), dtype=bool)  # (from, to): a move some route takes
        toward = came[row, states]
        if forward:
            entered[toward, states] = True
        else:
            entered[states, toward] = True
        keep = entered[self.arc_src, self.arc_dst]
        if np.count_nonzero(keep) < np.count_nonzero(entered):  # a move narrowed away earlier
            return super().on_routes(sources, sinks)
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


def _graphs(
    size: int, src: np.ndarray, dst: np.ndarray, cost: np.ndarray
) -> tuple[csr_array, csr_array]:
    """The moves as sparse graphs, forward and backward."""
    # explicit entries, zeros included, are moves: a free move stays one
    forward = csr_array((cost, (src, dst)), shape=(size, size))
    return forward, csr_array((cost, (dst, src)), shape=(size, size))


def _beaten(size: int, src: np.ndarray, dst: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Per move ``src[i] -> dst[i]`` (one per pair of ends), whether a route of two moves
    costs less, by more than rounding: such a move is on no cheapest route, and each
    search relaxes every move it keeps. Routes are tried through the states whose moves
    in times moves out are at most the square of the mean (a state with the moves of
    every other costs more to try than its detours save); trying fewer keeps more moves,
    never a wrong price."""
    by_dst = np.argsort(dst, kind="stable")
    into = np.searchsorted(dst[by_dst], np.arange(size + 1))
    by_src = np.argsort(src, kind="stable")
    out = np.searchsorted(src[by_src], np.arange(size + 1))
    work = np.diff(into) * np.diff(out)
    best = np.full((size, size), np.inf)  # (from, to): the cheapest route of two moves
    for via in np.flatnonzero((work > 0) & (work <= (len(src) / max(size, 1)) ** 2)).tolist():
        a, b = by_dst[into[via] : into[via + 1]], by_src[out[via] : out[via + 1]]
        block = np.ix_(src[a], dst[b])
        best[block] = np.minimum(best[block], cost[a][:, None] + cost[b][None, :])
    return best[src, dst] < cost * (1 - _ROUNDING)


# A call searching from 1 / this of a network's states or more first leaves out the moves
# a route of two beats (Prices._search): on 4-D meshes the searches then relax a third.
_TRIM_SHARE = 4
# A route of two moves beats a move only when cheaper by more than this share of its
# price: sums rounded otherwise would drop a move on a cheapest route.
_ROUNDING = 1e-12
