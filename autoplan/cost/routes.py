"""Redistribution routes: the cheapest chain of DTensor moves between two placements.

Stage 4, cost (built by :mod:`autoplan.cost.router`). Input: an edge's distinct
source placements (rows), target placements (columns), the tensor's shape and
element size. Output: the rows x columns matrix of *route* prices, and the
:class:`Network` the routes run through: every placement of the tensor the
route may pass (one of R, P or S(d) on each axis, plus those of every edge of
the same shape), the cheapest price between any two, and the direct moves
routes are made of.

Why routes: DTensor moves a tensor by one fixed per-axis walk, and a detour
can be far cheaper. On a (dp, tp, cp) mesh with tp across nodes and cp inside
one, ``S(0)S(2)R -> S(0)RR`` is a tp all-gather in which every GPU of a node pulls
the same bytes through its own NIC; chunking locally to ``S(0)S(2)S(2)`` first
(free) and gathering over the fused (tp, cp) group sends each byte across nodes
once. The planner prices every edge by its cheapest route, and :mod:`autoplan.runtime.execute`
runs the route hop by hop (the plan lists the routes that are not one move).

Why the network: a route price is a shortest-path distance, so the ILP can
carry an edge as a flow from the producer's placement to the consumer's
over the network's direct moves (:mod:`autoplan.ilp.formulation.matrix`) instead of one
variable per placement pair. The flow's LP relaxation equals the pairwise one
(both are transport problems with the same distances), and the moves that no
cheapest route needs are left out, so an edge carries far fewer moves than
placement pairs.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Self

import numpy as np

from autoplan.core.placements import Placements
from autoplan.core.torch_adapter import Partial, Placement, Replicate, Shard

# Relative slack when asking whether a move lies on a cheapest route (float sums).
_TIGHT = 1e-9


class Routes(ABC):
    """What the ILP reads of a route network: its states, the direct moves cheapest routes
    are made of (``arc_src/arc_dst/arc_cost``, each itself a cheapest route) and the
    cheapest price between states (:meth:`distances`, ``inf``: none). :class:`Network` keeps
    those prices in a matrix; another kind may compute them when asked
    (:class:`~autoplan.cost.mode_routes.ModeRoutes`)."""

    states: tuple[Placements, ...]
    arc_src: np.ndarray
    arc_dst: np.ndarray
    arc_cost: np.ndarray

    @property
    def size(self) -> int:
        return len(self.states)

    @abstractmethod
    def distances(self, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        """Cheapest route prices from each state of ``rows`` to each of ``cols`` (None:
        every state), shaped (rows, cols)."""

    @abstractmethod
    def with_arcs(self, keep: np.ndarray) -> Self:
        """The same network with only the arcs ``keep`` marks."""

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
        """Per state of ``states``, the least over ``i`` of the route price from
        ``heads[i]`` (``forward``) or to it, times each of ``scales`` in turn, less
        ``minus[i]``, plus ``plus[i]`` (NaN propagates, as :func:`numpy.minimum` does)."""
        prices = self.distances(heads, states) if forward else self.distances(states, heads).T
        for scale in scales:
            prices = prices * scale
        prices = prices - minus[:, None]
        prices = prices + plus[:, None]
        return np.minimum.reduce(prices, axis=0)

    @cached_property
    def _moves(self) -> np.ndarray:
        return self._move_mask()

    def _move_mask(self) -> np.ndarray:
        """The direct moves a route may take, as a (state, state) mask: the arcs."""
        moves = np.zeros((self.size, self.size), dtype=bool)
        moves[self.arc_src, self.arc_dst] = True
        return moves

    @cached_property
    def _trees(self) -> dict[int, np.ndarray]:
        return {}

    def route(self, a: int, b: int) -> list[int]:
        """The states of a cheapest route from a to b with the fewest moves (direct moves
        included, see :class:`Network`'s ``one_move``), both ends included.

        Found when asked, from the tree of routes out of ``a`` (:meth:`_tree`, kept per
        source), not kept for every pair by the closure: tracking first hops would slow
        every Floyd-Warshall pass for routes few sources are asked for.
        """
        parent = self.tree(a)
        if parent[b] < 0:
            if not np.isfinite(self.distances(np.array([a]), np.array([b]))[0, 0]):
                raise ValueError(f"no route from state {a} to state {b}")
            raise ValueError(f"the network's moves do not reach state {b} from state {a}")
        path = [b]
        while path[-1] != a:
            path.append(int(parent[path[-1]]))
        return path[::-1]

    def tree(self, a: int) -> np.ndarray:
        """Per state, the state before it on its route from ``a`` (:meth:`route`; ``a``
        itself for ``a``, -1 where no route reaches), kept per source."""
        parent = self._trees.get(a)
        if parent is None:
            parent = self._trees[a] = self._tree(a)
        return parent

    def _tree(self, a: int) -> np.ndarray:
        """Per state, the state before it on its route from ``a`` (``a`` itself for ``a``,
        -1 where no route reaches): breadth-first from ``a`` over the tight moves, those
        u->v with ``dist[a,u] + price`` equal to ``dist[a,v]``, the first to reach a state
        its parent.

        Every path of tight moves is a cheapest route, and breadth-first reaches each state
        by the fewest. A state on a cheapest route to b is reached by tight moves from
        states on such routes alone, so b's route is the one a search kept to the states
        on cheapest routes to b alone would find; one search serves every b.
        """
        from_a = self.distances(np.array([a]), None)[0]
        limit = from_a * (1 + _TIGHT) + _TIGHT
        reached = np.isfinite(from_a)
        parent = np.full(self.size, -1, dtype=np.int64)
        parent[a] = a
        moves = self._move_list
        if moves is None:
            frontier = [a]
            while frontier:
                found = []
                for u in frontier:
                    v, step = self._steps(u, reached)
                    v = v[from_a[u] + step <= limit[v]]
                    v = v[parent[v] < 0]
                    parent[v] = u
                    found.extend(v.tolist())
                frontier = found
            return parent
        # The same search a level at a time: a level's states in the order found, each
        # state's moves in list order, a state's parent the first of them to reach it.
        src, dst, price = moves
        tight = reached[dst] & (from_a[src] + price <= limit[dst])
        src, dst = src[tight], dst[tight]
        at = np.full(self.size, -1, dtype=np.int64)  # a frontier state's place in it
        level = np.array([a], dtype=np.int64)
        while level.size:
            at[level] = np.arange(level.size)
            take = np.flatnonzero((at[src] >= 0) & (parent[dst] < 0))
            take = take[np.argsort(at[src[take]], kind="stable")]
            at[level] = -1
            _, first = np.unique(dst[take], return_index=True)
            take = take[np.sort(first)]
            parent[dst[take]] = src[take]
            level = dst[take]
        return parent

    @cached_property
    def _move_list(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Every move a route may take, ``(from, to, price)``, by source state, each
        state's moves in one fixed order (a state's parent in a tree is the first state
        whose tight move reaches it); None where listing them all would price more than
        the searches ask (the search then reads a state at a time, :meth:`_steps`)."""
        return None

    def _steps(self, u: int, on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The moves out of ``u`` into states ``on`` marks, and their prices: each move
        is itself a cheapest route, so its price is its distance."""
        v = np.flatnonzero(self._moves[u] & on)
        return v, self.distances(np.array([u]), v)[0]

    def between(self, sources: np.ndarray, sinks: np.ndarray) -> Self:
        """The network with only the moves some cheapest route from ``sources`` to ``sinks``
        can use: a move x->y stays if it is tight from some source (it ends a cheapest
        route there) and tight toward some sink. Every move of a cheapest source-to-sink
        route is both, so every route price stays.

        Tight toward a sink is asked only of the moves tight from a source, and each
        side's distances are read once with the slack added and an unreachable state as
        NaN (which no comparison passes).
        """
        keep = self.on_routes(sources, sinks)
        return self if keep.all() else self.with_arcs(keep)

    def on_routes(self, sources: np.ndarray, sinks: np.ndarray) -> np.ndarray:
        """Per arc, whether :meth:`between` keeps it."""
        x, y, w = self.arc_src, self.arc_dst, self.arc_cost
        keep = np.zeros(len(x), dtype=bool)
        if not len(sources) or not len(sinks):
            return keep
        start, limit = _reached(self.distances(sources, None))  # from each source
        keep = (start[:, x] + w <= limit[:, y]).any(axis=0)
        tried = np.flatnonzero(keep)
        start, limit = _reached(self.distances(None, sinks))  # toward each sink
        keep[tried] = (w[tried, None] + start[y[tried]] <= limit[x[tried]]).any(axis=1)
        return keep


@dataclass(frozen=True, eq=False)
class Network(Routes):
    """A route network with its prices in a matrix: ``dist[a, b]``, the cheapest route
    price from state a to state b; ``one_move[a, b]``: whether the direct move a->b is
    itself a cheapest route (a route then takes it rather than a detour of equal price).
    """

    states: tuple[Placements, ...]
    dist: np.ndarray
    arc_src: np.ndarray
    arc_dst: np.ndarray
    arc_cost: np.ndarray
    one_move: np.ndarray | None = None

    def distances(self, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        if rows is None:
            return self.dist if cols is None else self.dist[:, cols]
        return self.dist[rows] if cols is None else self.dist[np.ix_(rows, cols)]

    def with_arcs(self, keep: np.ndarray) -> Network:
        return Network(
            self.states,
            self.dist,
            self.arc_src[keep],
            self.arc_dst[keep],
            self.arc_cost[keep],
            self.one_move,
        )

    def _move_mask(self) -> np.ndarray:
        return self.one_move if self.one_move is not None else super()._move_mask()

    @cached_property
    def _move_list(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        src, dst = np.nonzero(self._moves)  # by state, then ascending
        return src, dst, self.dist[src, dst]


def spreads(offset: np.ndarray) -> bool:
    """Whether an offset (``plus - minus`` of :meth:`Routes.least`) is NaN or ``-inf``: the
    whole matrix then carries it to every state, so no shortcut may skip a row."""
    return bool(np.isnan(offset).any() or (offset == -np.inf).any())


def _reached(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``dist`` with NaN where no route reaches, and the largest price still tight."""
    return np.where(np.isfinite(dist), dist, np.nan), dist * (1 + _TIGHT) + _TIGHT


@dataclass(frozen=True, eq=False)
class RoutedEdge:
    """One edge priced by routes: ``cost[r, c]``, the price from ``row_state[r]`` to
    ``col_state[c]`` in ``net``."""

    cost: np.ndarray
    net: Routes
    row_state: np.ndarray
    col_state: np.ndarray


def canonical(shape: Sequence[int], mesh_shape: Sequence[int]) -> list[Placements]:
    """Every placement tuple of a tensor of ``shape`` built from R, P and the S(d) that
    split dim d evenly on that axis (:func:`canonical_axes`): the placements a route may
    pass, in :func:`itertools.product` order.

    Uneven splits (a dim of 1 or 2 on an 8-way axis) are left out as waypoints: they
    enlarge the network (RoPE's rank-5 views most) and made no benchmarked plan cheaper.
    The placements of the edges of that shape are added whatever they are.
    """
    return [tuple(p) for p in itertools.product(*canonical_axes(shape, mesh_shape))]


def canonical_axes(shape: Sequence[int], mesh_shape: Sequence[int]) -> list[list[Placement]]:
    """Per mesh axis, the placements :func:`canonical` combines: R, P and the even S(d)."""
    return [
        [Replicate(), Partial(), *(Shard(d) for d, n in enumerate(shape) if n % m == 0 and n >= m)]
        for m in mesh_shape
    ]
