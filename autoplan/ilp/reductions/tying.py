"""Stage 5a (reductions), tying: nodes of identical repeated layers share variables.

Input: a :class:`~autoplan.cost.price.CostTable` (usually after
:mod:`autoplan.ilp.reductions.followers`). Output: a map node -> representative, where all
nodes of one class will take the same strategy.

Why: identical transformer layers trace into identical subgraphs with identical
prices, and sharing their variables shrinks the ILP to about one layer. Two nodes are
put in one class when a few rounds of Weisfeiler-Lehman refinement cannot tell them
apart: round 0 hashes a node's
own prices (its compute vector, and the shape and prices of each of its
edges); each further round adds the multiset of its neighbours' classes. Only
a few rounds are run (``rounds``): run to convergence, the refinement would
tell layer 5 from layer 6 by their distance to the embedding, and nothing
would be tied. Nodes at the ends of the layer stack differ from the middle
ones within those rounds and stay apart, which keeps the model honest there.

Tying is a restriction: the tied optimum can be worse than the untied one.
The planner reports both sizes, and tests bound the gap on small models.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost.block_diagonal import BlockDiagonal, Prices
from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.scratch import Scratch
from autoplan.ilp.tolerances import TIE_DECIMALS


@dataclass(frozen=True)
class Clustering:
    """``rep[v]`` is the representative of v's class (v itself when alone);
    ``edge_keys[id(e)]`` the price key of each edge, for the ILP builder to reuse."""

    rep: dict[str, str]
    edge_keys: dict[int, str]

    @property
    def num_classes(self) -> int:
        return len(set(self.rep.values()))

    @property
    def num_tied(self) -> int:
        return sum(1 for v, r in self.rep.items() if v != r)


def _digest(*parts: bytes | str) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"|")
    return h.hexdigest()


class _Digests:
    """Digests of arrays of prices rounded to :data:`TIE_DECIMALS`, once per array object
    (twin nodes and edges share their arrays), and of whole edge keys (``memo``). Each
    array is rounded into one reused buffer (:class:`~autoplan.ilp.scratch.Scratch`)."""

    def __init__(self) -> None:
        self.memo: dict[Any, str] = {}
        self._scratch = Scratch()

    def of(self, a: Prices) -> str:
        found = self.memo.get(id(a))
        if found is None:
            if isinstance(a, BlockDiagonal):  # by its blocks: twin layers share them
                found = _digest("diagonal", *(self.of(b) for b in a.blocks))
            else:
                found = self._digest(a)
            self.memo[id(a)] = found
        return found

    def _digest(self, a: np.ndarray) -> str:
        """The digest of ``a``'s rounded prices in C order and its shape."""
        rounded = self._scratch.like(a.shape)
        np.round(np.asarray(a, dtype=np.float64), TIE_DECIMALS, out=rounded)
        h = hashlib.blake2b(digest_size=12)
        h.update(rounded.data)  # C-contiguous: its bytes as tobytes() gives them
        h.update(str(a.shape).encode())
        h.update(b"|")
        return h.hexdigest()


def edge_key(e: EdgeCost, prices: _Digests | None = None) -> str:
    """What an edge costs, independent of which nodes it joins.

    ``prices`` memoizes the digest of each price matrix by identity, and the whole key by
    the identity of its arrays: edges of one placement pair and shape share one matrix
    object (the pricer caches it), so each distinct matrix is hashed once.
    """
    if prices is None:
        prices = _Digests()
    # twin edges share their matrix and group arrays too: one digest for all of them
    whole = (id(e.cost), id(e.src_group), id(e.dst_group), e.slot, e.src_out)
    key = prices.memo.get(whole)
    if key is None:
        price = prices.of(e.cost)
        key = prices.memo[whole] = _digest(
            str(e.slot), str(e.src_out), price, e.src_group.tobytes(), e.dst_group.tobytes()
        )
    return key


# Refinement rounds by default: enough to keep the first and last layers apart.
ROUNDS = 3


def cluster(costs: CostTable, *, rounds: int = ROUNDS) -> Clustering:
    """Classes of nodes that ``rounds`` of WL refinement cannot tell apart."""
    in_edges: dict[str, list[EdgeCost]] = defaultdict(list)
    out_edges: dict[str, list[EdgeCost]] = defaultdict(list)
    for e in costs.edges:
        in_edges[e.dst].append(e)
        out_edges[e.src].append(e)
    prices = _Digests()  # valid while costs holds the arrays
    keys = {id(e): edge_key(e, prices) for e in costs.edges}
    label: dict[str, str] = {}
    for v, c in costs.compute.items():
        mem = costs.memory.get(v)
        label[v] = _digest(
            prices.of(c),
            prices.of(mem) if mem is not None else b"-",
            ",".join(sorted("i" + keys[id(e)] for e in in_edges[v])),
            ",".join(sorted("o" + keys[id(e)] for e in out_edges[v])),
        )
    for _ in range(rounds):
        label = {
            v: _digest(
                label[v],
                ",".join(sorted(keys[id(e)] + label[e.src] for e in in_edges[v])),
                ",".join(sorted(keys[id(e)] + label[e.dst] for e in out_edges[v])),
            )
            for v in costs.compute
        }
    first: dict[str, str] = {}
    rep = {}
    for v in costs.compute:  # graph order: the earliest member represents its class
        rep[v] = first.setdefault(label[v], v)
    return Clustering(rep, keys)
