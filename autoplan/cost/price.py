"""Stage 4, cost: price every strategy and every edge of a strategy table.

Input: a :class:`~autoplan.strategies.table.StrategyTable`, the traced graph
(for op arguments) and a topology. Output: a :class:`CostTable`:

* ``compute[v][i]``: kernel microseconds of node v under strategy i;
* ``edges``: for each producer->consumer tensor, the redistribution matrix
  between the producer's distinct output placements (rows) and the
  consumer's distinct required input placements (columns), with maps from
  strategy index to row/column. Grouping by placement keeps the matrices as
  small as the placements are few, which is where the ILP's size comes from.
  Gradient edges (slot ``-1``) move a parameter's gradient to the
  parameter's own placement, as the optimizer step needs; cotangent edges
  (slot ``-2``) move an output's cotangent from where it arrives (the output's
  placement, a partial sum's as replicated: a loss computed on the output in
  place) to the placement the backward reads it in;
* ``memory[p][i]``: bytes per device of parameter p under strategy i, counting
  the parameter, its gradient and ``optimizer_states`` tensors of its size
  (AdamW: 2); a frozen parameter (``traced.frozen``) counts itself alone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from torch import fx

from autoplan.core.placements import Placements, cotangent_placements
from autoplan.core.topology import Topology
from autoplan.cost.block_diagonal import Prices
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.compute import ComputeModel, placements_bytes
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.redistribute import RedistributeModel, Step
from autoplan.cost.router import Router
from autoplan.cost.routes import Routes
from autoplan.strategies.table import StrategyTable, TensorInfo
from autoplan.trace.capture import TracedGraph

GRAD_SLOT = -1
TANGENT_SLOT = -2


@dataclass(frozen=True)
class EdgeCost:
    """Redistribution prices of one tensor edge, grouped by placement."""

    src: str
    src_out: int
    dst: str
    slot: int
    src_group: np.ndarray
    dst_group: np.ndarray
    cost: Prices  # block diagonal only in the layer modes' table (autoplan.memory.layer_modes)
    src_placements: tuple[Placements, ...] = field(default=())
    dst_placements: tuple[Placements, ...] = field(default=())
    tensor: TensorInfo | None = None
    # Route-priced edges (cost.routes): cost[r, c] = the network's distance from
    # row_state[r] to col_state[c].
    net: Routes | None = None
    row_state: np.ndarray | None = None
    col_state: np.ndarray | None = None

    def route(self, row: int, col: int) -> list[Placements]:
        """The placements the move from ``row`` to ``col`` passes, both ends included."""
        if self.net is None or self.row_state is None or self.col_state is None:
            return [self.src_placements[row], self.dst_placements[col]]
        states = self.net.route(int(self.row_state[row]), int(self.col_state[col]))
        return (
            [self.src_placements[row]]
            + [self.net.states[k] for k in states[1:-1]]
            + [self.dst_placements[col]]
        )

    def moved(self, **ends: Any) -> EdgeCost:
        """This edge with other ends (``src``, ``dst``, and their ``src_group`` and
        ``dst_group``). ``dataclasses.replace`` without running ``__init__`` again: the
        fields are this edge's, and every edge of every layer is moved so, at least once."""
        edge = object.__new__(EdgeCost)
        edge.__dict__.update(self.__dict__, **ends)
        return edge

    def route_steps(self, redist: RedistributeModel, row: int, col: int) -> list[Step]:
        """The priced collectives of the move from ``row`` to ``col``, hop after hop along
        its route (:meth:`RedistributeModel.steps` of each hop)."""
        if self.tensor is None:
            return []
        shape, nbytes = self.tensor.shape, self.tensor.dtype_bytes
        out: list[Step] = []
        for a, b in itertools.pairwise(self.route(row, col)):
            out += redist.steps(a, b, shape, nbytes) or ()
        return out


@dataclass(frozen=True)
class CostTable:
    """Everything the ILP minimizes over, in microseconds and bytes."""

    compute: dict[str, np.ndarray]
    edges: tuple[EdgeCost, ...]
    memory: dict[str, np.ndarray]
    # bytes per device per strategy of the values the forward keeps for the backward
    # (autoplan.memory.activations); in ``memory`` too when the budget counts them
    activations: dict[str, np.ndarray] = field(default_factory=dict)
    # node -> (group, width): its strategies come in blocks of ``width`` (one per
    # activation-checkpointing mode, autoplan.memory.layer_modes) and every node of the group
    # takes the same block; the prices hold that, this says it to the plan heuristics
    blocks: dict[str, tuple[str, int]] = field(default_factory=dict)


def _groups(placements: list[Placements | None]) -> tuple[np.ndarray, tuple[Placements, ...]]:
    # Strategies share their placement tuples: each object is hashed (in Python, for
    # DTensor's placements) once, and found by identity after.
    index: dict[Placements | None, int] = {}
    by_id: dict[int, int] = {}
    group = np.empty(len(placements), dtype=np.int64)
    for i, p in enumerate(placements):
        g = by_id.get(id(p))
        if g is None:
            g = by_id[id(p)] = index.setdefault(p, len(index))
        group[i] = g
    return group, tuple(index)  # type: ignore[arg-type]


def edge_cost(
    pricer: EdgePricer,
    src: str,
    src_out: int,
    dst: str,
    slot: int,
    src_placements: list[Placements | None],
    dst_placements: list[Placements | None],
    tensor: TensorInfo,
    router: Router | None = None,
    grouped: _Grouped | None = None,
) -> EdgeCost:
    """Group both sides by placement (or take ``grouped``, the same computed before) and
    price the (row, column) matrix: by the cheapest route when a ``router`` is given, by
    DTensor's one-step move otherwise."""
    sg, rows, dg, cols = grouped or (*_groups(src_placements), *_groups(dst_placements))
    if router is None:
        cost = pricer.matrix(rows, cols, tensor.shape, tensor.dtype_bytes)
        return EdgeCost(src, src_out, dst, slot, sg, dg, cost, rows, cols, tensor)
    r = router.edge(rows, cols, tensor.shape, tensor.dtype_bytes)
    return EdgeCost(
        src, src_out, dst, slot, sg, dg, r.cost, rows, cols, tensor, r.net, r.row_state, r.col_state
    )


# Each side of an edge grouped by placement: (group per strategy, distinct placements).
_Grouped = tuple[np.ndarray, tuple[Placements, ...], np.ndarray, tuple[Placements, ...]]


def _activation_edges(table: StrategyTable) -> dict[tuple[Any, ...], _Grouped]:
    """Each distinct activation edge's sides grouped as :func:`edge_cost` groups them, by
    the key :func:`price` caches edges under."""
    out: dict[tuple[Any, ...], _Grouped] = {}
    sides: dict[tuple[int, int, bool], tuple[np.ndarray, tuple[Placements, ...]]] = {}
    for ns in table.nodes.values():
        for slot, ref in enumerate(ns.inputs):
            producer = table.nodes[ref.node]
            key = (id(producer.strategies), ref.index, id(ns.strategies), slot, ns.in_tensors[slot])
            if key in out:
                continue
            src = (id(producer.strategies), ref.index, True)
            if src not in sides:
                sides[src] = _groups([s.outs[ref.index] for s in producer.strategies])
            dst = (id(ns.strategies), slot, False)
            if dst not in sides:
                sides[dst] = _groups([s.ins[slot] for s in ns.strategies])
            out[key] = (*sides[src], *sides[dst])
    return out


def state_copies(fqn: str, traced: TracedGraph, optimizer_states: int) -> int:
    """Tensors of a parameter's size its training keeps: itself, its gradient and its
    optimizer states; a frozen parameter only itself."""
    return 1 if fqn in traced.frozen else 2 + optimizer_states


def price(
    table: StrategyTable,
    traced: TracedGraph,
    topology: Topology,
    *,
    optimizer_states: int = 2,
    cache: bool = True,
    master_bytes: int | None = None,
    reduce_bytes: int | None = None,
    routes: bool = False,
) -> CostTable:
    """Price compute, redistribution and memory for every candidate in ``table``.

    ``cache=False`` prices every node and edge afresh instead of reusing a twin's.
    Mixed precision: ``master_bytes`` is the element size of the master weight,
    gradient and optimizer state (4 for float32 masters; default: the traced
    parameter's), ``reduce_bytes`` the element size gradients are reduced in
    (default: the gradient's). ``routes`` prices activation edges by their cheapest
    route (:mod:`autoplan.cost.routes`); gradient edges keep DTensor's one-step
    move, the reduction the optimizer step runs.
    """
    mesh_shape = table.mesh_shape
    compute_model = ComputeModel.of(topology, mesh_shape)
    pricer = EdgePricer(RedistributeModel(mesh_shape, CollectiveModel(topology)))
    router = Router(pricer) if routes else None
    fx_nodes: dict[str, fx.Node] = {n.name: n for n in traced.gm.graph.nodes}
    compute: dict[str, np.ndarray] = {}
    edges: list[EdgeCost] = []
    # Twin nodes of identical layers share their strategy tuple (see the
    # strategies stage), so prices are computed once per distinct question.
    compute_cache: dict[tuple[Any, ...], np.ndarray] = {}
    edge_cache: dict[tuple[Any, ...], EdgeCost] = {}
    grouped: dict[tuple[Any, ...], _Grouped] = {}
    if router is not None:  # every network built up front, closed on worker threads
        grouped = _activation_edges(table)
        router.precompute(
            (rows, cols, key[-1].shape, key[-1].dtype_bytes)
            for key, (_, rows, _, cols) in grouped.items()
        )
    for name, ns in table.nodes.items():
        node = fx_nodes[name]
        # A shared strategy tuple implies the same op, arguments and tensors.
        key = (id(ns.strategies),)
        if key not in compute_cache or not cache:
            compute_cache[key] = compute_model.times_us(ns, node)
        compute[name] = compute_cache[key]
        for slot, ref in enumerate(ns.inputs):
            producer = table.nodes[ref.node]
            ekey = (
                id(producer.strategies),
                ref.index,
                id(ns.strategies),
                slot,
                ns.in_tensors[slot],
            )
            cached = edge_cache.get(ekey) if cache else None
            if cached is None:
                cached = edge_cache[ekey] = edge_cost(
                    pricer,
                    ref.node,
                    ref.index,
                    name,
                    slot,
                    [s.outs[ref.index] for s in producer.strategies],
                    [s.ins[slot] for s in ns.strategies],
                    ns.in_tensors[slot],
                    router,
                    grouped.get(ekey),
                )
            edges.append(cached.moved(src=ref.node, dst=name))
    memory: dict[str, np.ndarray] = {}
    for fqn, pname in zip(traced.param_fqns, traced.params, strict=True):
        ns = table.nodes[pname]
        info = ns.out_tensors[0]
        assert info is not None
        elem = master_bytes or info.dtype_bytes
        copies = state_copies(fqn, traced, optimizer_states)
        memory[pname] = np.array(
            [
                placements_bytes(info.shape, elem, s.out(), mesh_shape) * copies
                for s in ns.strategies
            ],
            dtype=np.float64,
        )
        grad = traced.grads.get(fqn)
        if grad is not None and grad in table.nodes:
            g = table.nodes[grad]
            tensor = replace(info, dtype_bytes=reduce_bytes) if reduce_bytes else info
            gkey = (id(g.strategies), id(ns.strategies), tensor)
            cached = edge_cache.get(gkey) if cache else None
            if cached is None:
                cached = edge_cache[gkey] = edge_cost(
                    pricer,
                    grad,
                    0,
                    pname,
                    GRAD_SLOT,
                    [s.outs[0] for s in g.strategies],
                    [s.outs[0] for s in ns.strategies],
                    tensor,
                )
            edges.append(cached.moved(src=grad, dst=pname))
    for index, tangent in traced.tangents.items():
        out, t = table.nodes[traced.outputs[index]], table.nodes[tangent]
        info = t.out_tensors[0]
        assert info is not None
        edges.append(
            edge_cost(
                pricer,
                traced.outputs[index],
                0,
                tangent,
                TANGENT_SLOT,
                [cotangent_placements(s.out()) for s in out.strategies],
                [s.outs[0] for s in t.strategies],
                info,
            )
        )
    return CostTable(compute=compute, edges=tuple(edges), memory=memory)
