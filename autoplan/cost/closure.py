"""Cheapest routes over a network's direct moves: prices, and the moves routes need.

Stage 4, cost (called by :mod:`autoplan.cost.routes`). Input: the n x n matrix of
one-move prices between a network's states (``inf``: DTensor cannot make the
move). Output: the n x n cheapest route prices (Floyd-Warshall), which direct
moves the cheapest routes need, and which direct moves are themselves cheapest
routes (boolean matrices).

Why its own module: these are passes over n x n arrays (scipy's Floyd-Warshall,
then numpy), which the router runs on worker threads while the planner's thread
prices the next network; they know nothing of placements.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.csgraph import csgraph_from_dense, floyd_warshall


def closure(direct: np.ndarray) -> np.ndarray:
    """Cheapest route prices over the moves ``direct`` (Floyd-Warshall, scipy's csgraph).

    The graph is read with ``inf`` as "no move", so that free moves (price 0) stay
    moves: scipy reads a dense array's zeros as missing edges."""
    graph = csgraph_from_dense(np.asarray(direct, dtype=np.float64), null_value=np.inf)
    return floyd_warshall(graph, directed=True)


def route_arcs(direct: np.ndarray, dist: np.ndarray, tight: np.ndarray | None = None) -> np.ndarray:
    """Which direct moves the cheapest routes need (a boolean matrix).

    A move a->b is left out when some other state k has
    ``dist[a,k] + dist[k,b] <= direct[a,b]``: a route through k is no dearer.
    With no cycle of free moves, every cheapest route then survives (take one
    with the most moves: each of its moves is needed, or a detour would give
    one with more). A network with a free cycle keeps every move that is
    itself a cheapest route. ``tight``: :func:`one_move`, when already made.

    Only moves that are themselves cheapest routes can stay, so only they are
    tested, row by row against every k: they are a small share of all pairs.
    """
    n = len(direct)
    if tight is None:
        tight = one_move(direct, dist)
    if _free_cycle(direct):
        return tight
    into = np.ascontiguousarray(dist.T)  # into[b, k] = dist[k, b]
    kept = tight.copy()
    for a in range(n):
        bs = np.flatnonzero(tight[a])
        if not len(bs):
            continue
        via = into[bs] + dist[a][None, :]  # via[j, k] = dist[a, k] + dist[k, bs[j]]
        via[:, a] = np.inf
        via[np.arange(len(bs)), bs] = np.inf
        kept[a, bs] = ~(via <= direct[a, bs][:, None]).any(axis=1)
    return kept


def _free_cycle(direct: np.ndarray) -> bool:
    """Whether zero-price moves (other than staying put) form a cycle.

    Peels the states no free move enters, layer by layer: the free moves are acyclic
    iff that empties the network. As many numpy passes as the longest free chain has
    moves (a few), where squaring the reachability matrix takes log2(n) n x n products.
    """
    free = (direct == 0.0) & ~np.eye(len(direct), dtype=bool)
    alive = np.arange(len(direct))
    while len(alive):
        entered = free[np.ix_(alive, alive)].any(axis=0)
        if entered.all():
            return True  # every state left has a free move into it: a cycle
        alive = alive[entered]
    return False


def one_move(direct: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """Which direct moves are themselves cheapest routes (staying put left out)."""
    tight = np.isfinite(direct) & (direct <= dist)
    np.fill_diagonal(tight, False)
    return tight


def close_network(direct: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cheapest prices, the moves routes need and the moves that are cheapest routes
    (boolean matrices)."""
    dist = closure(direct)
    tight = one_move(direct, dist)
    return dist, route_arcs(direct, dist, tight), tight
