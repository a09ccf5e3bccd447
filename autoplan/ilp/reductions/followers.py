"""Stage 5a (reductions), followers: merge *follower* nodes into their producer.

Input: a :class:`~autoplan.strategies.table.StrategyTable` and its
:class:`~autoplan.cost.price.CostTable`. Output: a smaller CostTable plus the
map that recovers every merged node's strategy from its root's.

A follower is a node with one tensor input whose strategies can take *every*
placement its producer can give unchanged (views, transposes, unary
pointwise ops, getitem, dtype casts...), or a pointwise op with several
inputs, which follows its largest input (as Alpa's auto-sharding does); its
other inputs keep their edges, now ending at the root. For each producer strategy i the
follower runs the cheapest strategy j whose input placement equals the
producer's output placement: no redistribution at its input. Its compute is
added to the producer's strategy i, and its outgoing edges leave from the
producer, re-indexed through j(i). Chains collapse into one root.

Why: it removes most nodes of a transformer graph and their edge matrices. What it
gives up: a plan that redistributes *before* a follower rather than after it. For
views and elementwise ops both move the same bytes, so the price of that restriction
is small; the brute-force tests bound it on small graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.core.by_identity import ByIdentity
from autoplan.cost.price import GRAD_SLOT, CostTable, EdgeCost
from autoplan.strategies.table import StrategyTable

FOLLOWED = -1
FOLDED = -2


@dataclass(frozen=True)
class Reduction:
    """The reduced costs, for each merged node its root and strategy map, and for each
    edge of the input costs where it went: its index among the reduced edges, or
    :data:`FOLLOWED` (the edge a follower was merged through, free at every strategy) or
    :data:`FOLDED` (both ends in one root: added to the root's compute)."""

    costs: CostTable
    roots: dict[str, tuple[str, np.ndarray]]
    fates: tuple[int, ...] = ()

    @classmethod
    def unreduced(cls, costs: CostTable) -> Reduction:
        """No node merged: ``costs`` itself."""
        return cls(costs, {}, tuple(range(len(costs.edges))))

    def root_of(self, v: str) -> tuple[str, np.ndarray | None]:
        """v's root and the map from the root's strategies to v's (None: v is a root)."""
        found = self.roots.get(v)
        return (v, None) if found is None else found

    @property
    def num_merged(self) -> int:
        return len(self.roots)

    def expand(self, choice: dict[str, int]) -> dict[str, int]:
        """Choices for every node, merged ones included."""
        full = dict(choice)
        for v, (root, mapping) in self.roots.items():
            full[v] = int(mapping[choice[root]])
        return full


def _numel(e: EdgeCost) -> int:
    return math.prod(e.tensor.shape) if e.tensor is not None else 0


def _same_cols(e: EdgeCost, memo: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    """Per row of ``e``, the column with the same placement (-1: none).

    Twin edges share their placement tuples, so the matching is hashed once per pair of
    tuples (``memo``, keyed by identity, lives as long as the cost table it reads).
    """
    key = (id(e.src_placements), id(e.dst_placements))
    found = memo.get(key)
    if found is None:
        col_of = {p: c for c, p in enumerate(e.dst_placements)}
        found = memo[key] = np.array([col_of.get(p, -1) for p in e.src_placements], dtype=np.int64)
    return found


def _follow_map(
    in_edge: EdgeCost,
    compute_v: np.ndarray,
    memo: dict[tuple[int, int], np.ndarray],
    maps: dict[tuple[Any, ...], np.ndarray | None],
) -> np.ndarray | None:
    """j(i) for each producer strategy i, or None if some placement cannot pass through.

    Twin edges into twin followers ask the same question: ``maps`` answers it once.
    """
    key = (
        id(in_edge.src_placements),
        id(in_edge.dst_placements),
        id(in_edge.cost),
        id(in_edge.src_group),
        id(in_edge.dst_group),
        compute_v.tobytes(),
    )
    if key not in maps:
        maps[key] = _follow_map_uncached(in_edge, compute_v, memo)
    return maps[key]


def _follow_map_uncached(
    in_edge: EdgeCost, compute_v: np.ndarray, memo: dict[tuple[int, int], np.ndarray]
) -> np.ndarray | None:
    col = _same_cols(in_edge, memo)
    if (col < 0).any() or (in_edge.cost[np.arange(len(col)), col] != 0.0).any():
        return None  # every row stands for at least one producer strategy
    # per column, its cheapest strategy (the first of equals)
    g = in_edge.dst_group
    order = np.lexsort((np.arange(len(g)), compute_v, g))
    first = np.ones(len(order), dtype=bool)
    first[1:] = g[order][1:] != g[order][:-1]
    best = np.full(int(g.max()) + 1, -1, dtype=np.int64)
    best[g[order][first]] = order[first]
    return best[col][in_edge.src_group]


def collapse_followers(
    table: StrategyTable, costs: CostTable, *, keep: set[str] | None = None
) -> Reduction:
    """Merge follower nodes into their producers (see module docstring).

    Nodes in ``keep`` (e.g. those with user constraints) are never merged.
    """
    keep = keep or set()
    in_edges: dict[str, list[EdgeCost]] = {}
    out_edges: dict[str, list[EdgeCost]] = {}
    for e in costs.edges:
        in_edges.setdefault(e.dst, []).append(e)
        out_edges.setdefault(e.src, []).append(e)
    # arrays are replaced, never written: the cost table's stay shared between twin
    # nodes, and so do the sums and maps made from them (``made``)
    made = _Made()
    compute = dict(costs.compute)
    memory = dict(costs.memory)
    # root[v] = (root name, map root strategy -> v strategy)
    roots: dict[str, tuple[str, np.ndarray]] = {}

    def resolve(u: str) -> tuple[str, np.ndarray]:
        if u in roots:
            return roots[u]
        return u, made.identity(len(costs.compute[u]))

    followed: dict[str, EdgeCost] = {}
    memo: dict[tuple[int, int], np.ndarray] = {}
    maps: dict[tuple[Any, ...], np.ndarray | None] = {}
    for v, ns in table.nodes.items():
        edges = [e for e in in_edges.get(v, []) if e.slot != GRAD_SLOT]
        if ns.kind != "op" or v in keep or not edges or len(edges) != len(in_edges.get(v, [])):
            continue
        # a recomputed node (autoplan.memory.recompute) has a second edge from its input and
        # stays unmerged: made to follow its producer, it makes recomputing plans dearer
        if len(edges) > 1 and not (ns.pointwise and len(ns.out_tensors) == 1):
            continue
        # follow the largest input: the tensor a redistribution would move most bytes of
        e = max(edges, key=lambda x: (_numel(x), -x.slot))
        u_map = _follow_map(e, compute[v], memo, maps)
        if u_map is None:
            continue
        root, to_u = resolve(e.src)
        mapping = made.taken(u_map, to_u)
        compute[root] = made.added(compute[root], compute[v], mapping)
        if v in memory:  # a follower's bytes are its root's, strategy for strategy
            mem = made.taken(memory.pop(v), mapping)
            memory[root] = made.added(memory[root], mem, None) if root in memory else mem
        roots[v] = (root, mapping)
        followed[v] = e

    kept_edges: list[EdgeCost] = []
    fates = []
    for e in costs.edges:
        if followed.get(e.dst) is e:
            fates.append(FOLLOWED)
            continue  # the edge a follower was merged through
        src, dst = e.src, e.dst
        src_group, dst_group = e.src_group, e.dst_group
        if src in roots:
            src, m = roots[src]
            src_group = made.taken(e.src_group, m)
        if dst in roots:
            dst, m = roots[dst]
            dst_group = made.taken(e.dst_group, m)
        fates.append(len(kept_edges))
        kept_edges.append(e.moved(src=src, dst=dst, src_group=src_group, dst_group=dst_group))
    merged, index = _merge_self_edges(kept_edges, compute, made)
    reduced = CostTable(
        compute={v: c for v, c in compute.items() if v not in roots},
        edges=merged,
        memory=memory,
        activations=costs.activations,
    )
    return Reduction(reduced, roots, tuple(f if f < 0 else index[f] for f in fates))


def _merge_self_edges(
    edges: list[EdgeCost], compute: dict[str, np.ndarray], made: _Made
) -> tuple[tuple[EdgeCost, ...], list[int]]:
    """An edge whose both ends collapsed into one root is a per-strategy cost of that root:
    the other edges, and where each input edge went (its index, or :data:`FOLDED`)."""
    out: list[EdgeCost] = []
    index = []
    for e in edges:
        if e.src != e.dst:
            index.append(len(out))
            out.append(e)
            continue
        index.append(FOLDED)
        compute[e.src] = made.folded(compute[e.src], e)
    return tuple(out), index


class _Made:
    """The arrays the reduction makes from others, each once per distinct operands
    (:class:`~autoplan.core.by_identity.ByIdentity`): twin layers' nodes and edges hold
    the same arrays, so their sums and maps are one array too."""

    def __init__(self) -> None:
        self._memo = ByIdentity()

    def identity(self, n: int) -> np.ndarray:
        """``arange(n)``, the map of a root to itself."""
        return self._memo.made(("identity", n), (), lambda: np.arange(n))

    def taken(self, a: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``a[index]``."""
        return self._memo.made("taken", (a, index), lambda: a[index])

    def added(self, a: np.ndarray, b: np.ndarray, index: np.ndarray | None) -> np.ndarray:
        """``a + b[index]`` (``a + b`` when ``index`` is None)."""
        return self._memo.made(
            "added", (a, b, index), lambda: a + (b if index is None else b[index])
        )

    def folded(self, a: np.ndarray, e: EdgeCost) -> np.ndarray:
        """``a`` plus the prices of an edge whose ends are one root, strategy by strategy."""

        def make() -> np.ndarray:
            extra = e.cost[e.src_group, e.dst_group]
            return a + np.where(np.isfinite(extra), extra, np.inf)

        return self._memo.made("folded", (a, e.cost, e.src_group, e.dst_group), make)
