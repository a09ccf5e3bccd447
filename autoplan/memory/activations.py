"""Stage 4, cost: the activations a training step keeps from its forward for its backward.

Input: the traced joint graph and its strategy table. Output: for each forward value the
backward reads, its bytes per device under each strategy of the node that owns its
storage (:func:`activation_memory`); for each output, the bytes of its gradient the
backward holds (:func:`cotangent_memory`); and for a chosen plan, the backward's peak
(:func:`backward_peak`).

Why: the parallelized module splits the joint graph where the forward ends
(:func:`autoplan.core.graph.forward_part`, as torch's partitioner does in
:mod:`autoplan.runtime.lower`) and the forward hands the backward every forward value a backward
op reads; those stay allocated from their op to the backward, which at long sequences is
most of a step's memory. A moved copy of a value is made in the backward by the op that
reads it, so a value is kept at its producer's placement. A view keeps its base's
storage alive, so the base is counted, once; parameters, buffers and inputs are the
caller's (parameters are priced with their gradients and optimizer state). What is and
is not counted, and what a loss computed outside is assumed to hold: docs/memory.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
from torch import fx

from autoplan.core.graph import forward_part, is_tensor_node, source_name
from autoplan.core.placements import cotangent_placements
from autoplan.cost.buckets import GRAD_SLOT, RESHAPING, TailBucket, op_name
from autoplan.cost.compute import placements_bytes
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

__all__ = [
    "activation_memory",
    "backward_peak",
    "cotangent_memory",
    "saved_storage",
    "storage_root",
]


def saved_storage(traced: TracedGraph, recompute: Collection[str] = ()) -> list[str]:
    """The nodes (in graph order) whose storage the forward keeps for the backward: each
    forward value a backward op reads and each output of the model (which the caller
    holds while the backward runs), or the base it is a view of, but no placeholder.

    With ``recompute`` (forward nodes the backward computes again), what the step
    :func:`~autoplan.memory.recompute.with_recompute` makes keeps, read off this graph: the
    backward reads a recomputed value's copy instead of it, and each copy reads the
    originals of its inputs that are not recomputed themselves. No graph is copied, as
    :mod:`autoplan.memory.layer_modes` asks this of several modes on the one graph.
    """
    outputs = [traced.node(n) for n in traced.outputs]
    forward = forward_part(outputs)
    again = {n for n in forward if n.name in recompute} if recompute else set()
    read_by_copies = {a for r in again for a in r.all_input_nodes} - again
    kept: set[fx.Node] = set()
    for node in forward:
        if node.op == "placeholder" or not is_tensor_node(node):
            continue
        read_later = node in read_by_copies or (
            node not in again and any(u not in forward and u.op != "output" for u in node.users)
        )
        if read_later or node in outputs:
            root = storage_root(node)
            if root.op != "placeholder":
                kept.add(root)
    return [n.name for n in traced.gm.graph.nodes if n in kept]


def activation_memory(
    traced: TracedGraph, table: StrategyTable, recompute: Collection[str] = ()
) -> dict[str, np.ndarray]:
    """Bytes per device of each kept value (:func:`saved_storage`, ``recompute`` as there)
    under each strategy of its node: the local size of its output placement, in its
    traced dtype."""
    out: dict[str, np.ndarray] = {}
    shared: dict[tuple[Any, ...], np.ndarray] = {}  # twin nodes share their strategy tuple
    for name in saved_storage(traced, recompute):
        ns = table.nodes.get(name)
        if ns is None or not ns.out_tensors or (info := ns.out_tensors[0]) is None:
            continue
        key = (id(ns.strategies), info.shape, info.dtype_bytes)
        if key not in shared:
            shared[key] = np.array(
                [
                    placements_bytes(info.shape, info.dtype_bytes, s.out(), table.mesh_shape)
                    for s in ns.strategies
                ],
                dtype=np.float64,
            )
        out[name] = shared[key]
    return out


def cotangent_memory(traced: TracedGraph, table: StrategyTable) -> dict[str, np.ndarray]:
    """Bytes per device of each differentiable output's gradient as the backward program
    receives it, under each strategy of the output's node: the output's local size where
    its cotangent arrives (:func:`~autoplan.core.placements.cotangent_placements`: its placement, a partial
    sum's as replicated). It is held from the loss's backward to the end of the plan's
    backward (the backward program's arguments); a loss outside is assumed to hand it
    there and to keep nothing else (docs/memory.md)."""
    out: dict[str, np.ndarray] = {}
    for index in traced.tangents:
        name = traced.outputs[index]
        ns = table.nodes[name]
        info = ns.out_tensors[0]
        assert info is not None
        out[name] = np.array(
            [
                placements_bytes(
                    info.shape, info.dtype_bytes, cotangent_placements(s.out()), table.mesh_shape
                )
                for s in ns.strategies
            ],
            dtype=np.float64,
        )
    return out


def backward_peak(
    traced: TracedGraph,
    table: StrategyTable,
    choice: dict[str, int],
    buckets: Sequence[TailBucket] = (),
) -> tuple[float, float]:
    """Bytes per device the backward allocates at its fullest, and the gradients' bytes.

    The backward's ops run in graph order; a value lives from its op to its last reader
    (a view keeps its base alive); a gradient is moved to its parameter's placement as
    soon as it is computed, and that copy lives to the end (the backward program returns
    the gradients together); a copy an op's planned input placement needs lives while
    the op runs, and a cotangent moved from where it arrives to its planned placement
    from its first reader to its last; a recomputed copy (:mod:`autoplan.memory.recompute`) is
    priced as its original. A tail bucket (``buckets``, :func:`~autoplan.cost.buckets.
    tail_buckets`) allocates its flat buffer when its first member is computed: an
    all-reduce's holds its members' gradients from then on, a reduce-scatter's their
    inputs until its last member, where it makes their gradients. Beyond this the step holds the parameters, the
    optimizer state, the kept activations and the cotangents as they arrive
    (:func:`cotangent_memory`), which stay until the backward ends.
    """
    by_name = {n.name: n for n in traced.gm.graph.nodes}
    forward = forward_part([by_name[n] for n in traced.outputs])
    param_name = dict(zip(traced.param_fqns, traced.params, strict=True))
    param_of = {by_name[g]: param_name[f] for f, g in traced.grads.items()}
    nodes = [n for n in traced.gm.graph.nodes if n not in forward and n.op == "call_function"]
    order = {n: i for i, n in enumerate(nodes)}
    last: dict[fx.Node, int] = {}
    for n in nodes:
        root = storage_root(n)
        if root in order:
            uses = [order[u] for u in n.users if u in order] or [order[n]]
            last[root] = max(last.get(root, order[root]), *uses)
    nbytes = functools.cache(functools.partial(_bytes, mesh_shape=table.mesh_shape))
    at: dict[int, float] = {}  # bytes allocated at an op beyond its output, to their free
    frees: dict[int, float] = {}
    for size, first, end in _moved_cotangents(traced, table, choice, nodes, nbytes):
        at[first] = at.get(first, 0.0) + size
        frees[end] = frees.get(end, 0.0) + size
    paid: dict[int, float] = {}  # gradients' bytes returned early, in an all-reduce's buffer
    covered: set[fx.Node] = set()
    for bucket in buckets:
        placed = _bucket_span(bucket, by_name, order, param_of)
        if placed is None:
            continue
        first, end, grads = placed
        if bucket.kind == "all_reduce":
            paid[first] = paid.get(first, 0.0) + bucket.in_bytes
            covered |= grads
        elif bucket.kind == "reduce_scatter":  # its results made at its last member
            at[first] = at.get(first, 0.0) + bucket.in_bytes
            frees[end] = frees.get(end, 0.0) + bucket.in_bytes
            paid[end] = paid.get(end, 0.0) + bucket.out_bytes
            covered |= grads
    live = peak = returned = 0.0
    for i, n in enumerate(nodes):
        ns = table.nodes.get(source_name(n))
        # a multi-output op's outputs are its getitems' storage, a view its base's
        allocates = ns is not None and storage_root(n) is n and is_tensor_node(n)
        own = _out_bytes(ns, choice, nbytes) if allocates else 0.0
        live += own + at.get(i, 0.0)
        frees[last.get(n, i)] = frees.get(last.get(n, i), 0.0) + own
        moved = _moved_bytes(ns, choice, table, nbytes) if ns is not None else 0.0
        returned += paid.get(i, 0.0)
        if n in param_of and n not in covered and ns is not None:
            info, param = ns.out_tensors[0], table.nodes[param_of[n]]
            assert info is not None, f"gradient {n.name} is not a tensor"
            returned += nbytes(
                info.shape, info.dtype_bytes, param.strategies[choice[param.name]].outs[0]
            )
        peak = max(peak, live + returned + moved)
        live -= frees.pop(i, 0.0)
    return peak, returned


def _moved_cotangents(
    traced: TracedGraph,
    table: StrategyTable,
    choice: dict[str, int],
    nodes: list[fx.Node],
    nbytes: Callable[..., float],
) -> list[tuple[float, int, int]]:
    """Each cotangent the backward reads elsewhere than where it arrives: its moved
    copy's bytes and the positions in ``nodes`` of its first and last reader."""
    order = {n: i for i, n in enumerate(nodes)}
    out = []
    for index, name in traced.tangents.items():
        output = table.nodes[traced.outputs[index]]
        tangent = table.nodes.get(name)
        if tangent is None or name not in choice:
            continue
        planned = tangent.strategies[choice[name]].outs[0]
        if planned == cotangent_placements(output.strategies[choice[output.name]].out()):
            continue
        readers = [order[u] for u in traced.node(name).users if u in order]
        info = tangent.out_tensors[0]
        if readers and info is not None:
            size = nbytes(info.shape, info.dtype_bytes, planned)
            out.append((size, min(readers), max(readers)))
    return out


def _bucket_span(
    bucket: TailBucket,
    by_name: dict[str, fx.Node],
    order: dict[fx.Node, int],
    param_of: dict[fx.Node, str],
) -> tuple[int, int, set[fx.Node]] | None:
    """Where a tail bucket's flat buffer is made and its collective runs (the positions
    of its first and last member's value), and the gradients its members become; None
    when a member's gradient is not found through reshaping ops."""
    sources = [by_name[src] for src, _, _ in bucket.edges]
    if not all(s in order for s in sources):
        return None
    grads = set()
    for src, dst, slot in bucket.edges:
        grad = by_name[src] if slot == GRAD_SLOT else _gradient_after(by_name[dst], param_of)
        if grad is None:
            return None
        grads.add(grad)
    positions = [order[s] for s in sources]
    return min(positions), max(positions), grads


def _gradient_after(node: fx.Node, param_of: dict[fx.Node, str]) -> fx.Node | None:
    """The gradient a tail move's destination reaches through reshaping ops alone."""
    while node not in param_of:
        users = [u for u in node.users if u.op != "output"]
        if len(users) != 1 or op_name(users[0].target) not in RESHAPING:
            return None
        node = users[0]
    return node


def _bytes(shape: tuple[int, ...], elem: int, where: Any, *, mesh_shape: tuple[int, ...]) -> float:
    return float(placements_bytes(shape, elem, where, mesh_shape))


def _out_bytes(ns: Any, choice: dict[str, int], nbytes: Callable[..., float]) -> float:
    strategy = ns.strategies[choice[ns.name]]
    return sum(
        nbytes(info.shape, info.dtype_bytes, where)
        for info, where in zip(ns.out_tensors, strategy.outs, strict=True)
        if info is not None and where is not None
    )


def _moved_bytes(
    ns: Any, choice: dict[str, int], table: StrategyTable, nbytes: Callable[..., float]
) -> float:
    """The copies of a node's inputs moved to the placements its strategy reads them in."""
    strategy = ns.strategies[choice[ns.name]]
    total = 0.0
    for ref, info, want in zip(ns.inputs, ns.in_tensors, strategy.ins, strict=True):
        producer = table.nodes.get(ref.node)
        if info is None or producer is None or ref.node not in choice:
            continue
        if producer.strategies[choice[ref.node]].outs[ref.index] != want:
            total += nbytes(info.shape, info.dtype_bytes, want)
    return total


def storage_root(node: fx.Node) -> fx.Node:
    """The node whose output allocates ``node``'s storage: through views to their base."""
    while getattr(node.target, "is_view", False):  # an aten overload that aliases its input
        base = node.args[0]
        if not isinstance(base, fx.Node):
            break
        node = base
    return node
