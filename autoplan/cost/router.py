"""Pricing edges by routes: one route network per tensor shape, built for a planning run.

Stage 4, cost (called by :mod:`autoplan.cost.price`). Input: every routed edge's distinct
source and target placements, its tensor's shape and element size. Output: per edge a
:class:`~autoplan.cost.routes.RoutedEdge`, its route prices and the network they run
through (:mod:`autoplan.cost.routes` says why routes, and what a network is).

Why one module: the networks of a run are built together, so that the edges of one
shape share one (a move then has one price whatever edge asks), the big ones closed on
worker threads while the next is priced; on meshes of four axes or more they are lazy
(:mod:`autoplan.cost.lazy_routes`) and price only their near moves.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from autoplan.core.placements import Placements
from autoplan.cost.closure import close_network
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.lazy_routes import LazyNetwork
from autoplan.cost.near_moves import near_pairs
from autoplan.cost.routes import Network, RoutedEdge, Routes, canonical, canonical_axes

__all__ = ["LAZY_AXES", "Router"]


class Router:
    """Prices edges by routes on one mesh; caches networks and edges for one planning run."""

    def __init__(self, pricer: EdgePricer) -> None:
        self.pricer = pricer
        self._canon: dict[tuple[int, ...], tuple[list[Placements], tuple[int, ...]]] = {}
        # per tensor's placements per axis: its near moves (many shapes share the options)
        self._near: dict[tuple[tuple[Any, ...], ...], tuple[np.ndarray, np.ndarray]] = {}
        self._nets: dict[tuple[tuple[int, ...], tuple[int, ...], int], Routes] = {}
        self._edges: dict[
            tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int], RoutedEdge
        ] = {}

    def edge(
        self,
        rows: Sequence[Placements],
        cols: Sequence[Placements],
        shape: tuple[int, ...],
        dtype_bytes: int,
    ) -> RoutedEdge:
        """Route prices from each of ``rows`` to each of ``cols`` (see the module docstring).
        An edge :meth:`precompute` was not given gets a network of its own placements."""
        key = (self.pricer.ids(rows), self.pricer.ids(cols), shape, dtype_bytes)
        if key not in self._edges:  # not precomputed: built here, in this thread
            self.precompute([(rows, cols, shape, dtype_bytes)])
        return self._edges[key]

    def _canonical(self, shape: tuple[int, ...]) -> tuple[list[Placements], tuple[int, ...]]:
        if shape not in self._canon:
            states = canonical(shape, self.pricer.redist.mesh_shape)
            self._canon[shape] = (states, self.pricer.ids(states))
        return self._canon[shape]

    def precompute(
        self,
        edges: Iterable[tuple[Sequence[Placements], Sequence[Placements], tuple[int, ...], int]],
    ) -> None:
        """Price these (rows, cols, shape, dtype_bytes) edges by routes before :meth:`edge`
        asks for them. The edges of one tensor shape and element size share one network:
        the waypoints and every placement any of them has. Networks are priced in this
        thread while the ones before are closed on worker threads.

        One network per shape, so that a move has one price whatever edge asks: routes
        through the edges' own placements (the strided ones, which are no waypoints) are
        most of what makes moves cheap, and with a network per edge an edge with fewer of
        them would pay more for the same move.

        Closing a network (Floyd-Warshall, then :func:`route_arcs`) is n numpy passes over
        n x n arrays, which numpy runs without holding the GIL, while pricing its moves is
        Python: so the two overlap.
        """
        asked: dict[tuple[Any, ...], tuple[tuple[int, ...], int]] = {}  # edge -> its group
        groups: dict[tuple[tuple[int, ...], int], dict[int, Placements]] = {}
        for rows, cols, shape, dtype_bytes in edges:
            row_ids, col_ids = self.pricer.ids(rows), self.pricer.ids(cols)
            edge_key = (row_ids, col_ids, shape, dtype_bytes)
            if edge_key in self._edges or edge_key in asked:
                continue
            asked[edge_key] = (shape, dtype_bytes)
            own = groups.setdefault((shape, dtype_bytes), {})
            for i, p in zip(row_ids + col_ids, [*rows, *cols], strict=True):
                own.setdefault(i, p)
        todo: dict[tuple[Any, ...], tuple[list[Placements], tuple[int, ...], tuple[int, ...]]] = {}
        net_of: dict[tuple[tuple[int, ...], int], tuple[Any, ...]] = {}
        for (shape, dtype_bytes), own in groups.items():
            canon, canon_ids = self._canonical(shape)
            waypoints = set(canon_ids)
            # by id, not in the edges' order: the same placements make the same network
            extra_ids = tuple(sorted(i for i in own if i not in waypoints))
            key = net_of[shape, dtype_bytes] = (canon_ids + extra_ids, shape, dtype_bytes)
            if key not in self._nets and key not in todo:
                todo[key] = (canon + [own[i] for i in extra_ids], canon_ids, extra_ids)
        self._build(todo)
        where = {key: {s: k for k, s in enumerate(key[0])} for key in net_of.values()}
        states: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        for (row_ids, col_ids, _, _), group in asked.items():
            pos = where[net_of[group]]
            states[row_ids, col_ids, *group] = (
                np.array([pos[i] for i in row_ids], dtype=np.int64),
                np.array([pos[i] for i in col_ids], dtype=np.int64),
            )
        narrowed = self._narrowed({k: net_of[k[2:]] for k in states}, states)
        for (row_ids, col_ids, shape, dtype_bytes), group in asked.items():
            net = narrowed.get(net_of[group], self._nets[net_of[group]])
            row_state, col_state = states[row_ids, col_ids, shape, dtype_bytes]
            cost = net.distances(row_state, col_state)
            self._edges[row_ids, col_ids, shape, dtype_bytes] = RoutedEdge(
                cost, net, row_state, col_state
            )

    def _narrowed(
        self,
        net_of: dict[tuple[Any, ...], tuple[Any, ...]],
        states: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]],
    ) -> dict[tuple[Any, ...], Routes]:
        """The lazy networks of these edges (edge -> its network's key, edge -> its row
        and column states), each narrowed to the moves some cheapest route from their
        rows to their columns takes (:meth:`Routes.between`): its near moves are a tenth
        of its pairs, and the ILP carries an edge as a flow over the network's moves
        only where they are fewer than the edge's pairs. The network kept for edges
        asked later stays whole."""
        ends: dict[tuple[Any, ...], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for edge, key in net_of.items():
            if isinstance(self._nets[key], LazyNetwork):
                rows, cols = ends.setdefault(key, ([], []))
                rows.append(states[edge][0])
                cols.append(states[edge][1])
        return {
            key: self._nets[key].between(
                np.unique(np.concatenate(rows)), np.unique(np.concatenate(cols))
            )
            for key, (rows, cols) in ends.items()
        }

    def _build(
        self, todo: dict[tuple[Any, ...], tuple[list[Placements], tuple[int, ...], tuple[int, ...]]]
    ) -> None:
        """Price and close the networks of ``todo`` (key -> states, waypoint ids, own ids),
        the big ones on worker threads while the next is priced."""
        running: deque[tuple[Any, list[Placements], np.ndarray, Future[Any]]] = deque()

        def finish() -> None:
            done, states, direct, closed = running.popleft()
            self._nets[done] = _assemble(states, direct, *closed.result())

        pool: ThreadPoolExecutor | None = None
        try:
            for key, (states, canon_ids, extra_ids) in todo.items():
                if len(self.pricer.redist.mesh_shape) >= LAZY_AXES:
                    self._nets[key] = self._lazy(states, canon_ids, extra_ids, key[1], key[2])
                    continue
                direct = self._direct(canon_ids, extra_ids, key[1], key[2])
                if len(direct) < _THREADED:  # cheaper to close here than to hand over
                    self._nets[key] = _assemble(states, direct, *close_network(direct))
                    continue
                pool = pool or ThreadPoolExecutor(_WORKERS)
                running.append((key, states, direct, pool.submit(close_network, direct)))
                while len(running) > _WORKERS:  # at most one priced network waiting
                    finish()
            while running:
                finish()
        finally:
            if pool is not None:
                pool.shutdown()

    def _lazy(
        self,
        states: list[Placements],
        canon: tuple[int, ...],
        extra: tuple[int, ...],
        shape: tuple[int, ...],
        dtype_bytes: int,
    ) -> LazyNetwork:
        """A network priced by its near moves between waypoints
        (:func:`~autoplan.cost.near_moves.near_pairs`) and every move into and out of the
        edges' own placements (a few, not product-shaped), its prices found when asked."""
        per_axis = tuple(map(tuple, canonical_axes(shape, self.pricer.redist.mesh_shape)))
        if per_axis not in self._near:
            self._near[per_axis] = near_pairs(per_axis)
        src, dst = self._near[per_axis]
        ids = np.array(canon + extra, dtype=np.int64)
        cost = self.pricer.pair_prices(ids[src], ids[dst], shape, dtype_bytes)
        moves = [(src, dst, cost)]
        n = len(canon)
        price = self.pricer.matrix_of_ids
        for rows, cols, r0, c0 in ((canon, extra, 0, n), (extra, canon + extra, n, 0)):
            if rows and cols:
                block = price(rows, cols, shape, dtype_bytes)
                r, c = np.nonzero(np.isfinite(block))
                moves.append((r + r0, c + c0, block[r, c]))
        src, dst, cost = (np.concatenate(m) for m in zip(*moves, strict=True))
        return LazyNetwork.of(tuple(states), src, dst, cost)

    def _direct(
        self,
        canon: tuple[int, ...],
        extra: tuple[int, ...],
        shape: tuple[int, ...],
        dtype_bytes: int,
    ) -> np.ndarray:
        """One-move prices between a network's states, priced by blocks of placement ids:
        the waypoint block's layout is shared by every network with the same waypoints and
        divisibility, whatever the edge adds."""
        price = self.pricer.matrix_of_ids
        direct = price(canon, canon, shape, dtype_bytes)
        if extra:
            direct = np.block(
                [
                    [direct, price(canon, extra, shape, dtype_bytes)],
                    [
                        price(extra, canon, shape, dtype_bytes),
                        price(extra, extra, shape, dtype_bytes),
                    ],
                ]
            )
        return direct


# Meshes of this many axes or more get lazy networks (Router._lazy): a network's states
# grow as (placements per axis)^axes, and closing all pairs of them was most of planning.
LAZY_AXES = 4
# Threads that close networks while the planner's thread prices the next (Router.precompute).
_WORKERS = max(1, min(4, os.cpu_count() or 1))
# Networks of fewer states are closed in the planner's thread: on small arrays the
# hand-over to a worker costs more than it saves (threshold tuned on the 70B plans, see
# benchmarks/NOTES.md).
_THREADED = 344


def _assemble(
    states: list[Placements],
    direct: np.ndarray,
    dist: np.ndarray,
    arcs: np.ndarray,
    one_move: np.ndarray,
) -> Network:
    a, b = np.nonzero(arcs)
    return Network(tuple(states), dist, a, b, direct[a, b], one_move)
