"""Activation checkpointing: which forward values each layer computes again in the
backward instead of keeping them, its price, and the joint graph that does it.

Input: a traced joint graph whose forward nodes carry their layer
(:func:`autoplan.core.graph.layer_of`) and a mode. Output: the forward nodes to recompute
(:func:`recompute_set`, used by the cost stage and recorded in the plan), the cost
table with their second run priced (:func:`priced_recompute`), and the joint graph
whose backward runs them again (:func:`with_recompute`, used to price the kept
activations and the backward's peak, and by the applied module).

Why a graph rewrite: the parallelized module splits the joint graph where the forward
ends and the backward reads whatever forward value it uses (:mod:`autoplan.runtime.lower`); a
copy of a forward op placed in the backward, reading what the layer keeps, is exactly a
recomputation, which the same split, lowering and collectives then run as planned.
A copy runs with its original's planned strategy, so its second run costs the op's
compute and its inputs' moves once more, and the plan's prices stay exact.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import fx

from autoplan.core.config import CHECKPOINT_MODES as MODES
from autoplan.core.errors import PlanError
from autoplan.core.graph import RECOMPUTES, forward_part, layer_of
from autoplan.core.torch_adapter import make_graph_module, mutates, use_lazy_graph_module
from autoplan.cost.price import CostTable
from autoplan.memory.activations import activation_memory, cotangent_memory
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

__all__ = [
    "MODES",
    "checkpointed",
    "layer_names",
    "priced_recompute",
    "recompute_set",
    "stepped_moves",
    "with_recompute",
]

_COPY = "_recompute"  # the suffix of a copy's name

# What selective checkpointing keeps: the ops whose recomputation costs the most per
# byte kept (matmuls and attention); norms, pointwise ops, RoPE and views run again.
_COSTLY = ("mm", "bmm", "addmm", "baddbmm", "einsum", "convolution", "scaled_dot_product")


def recompute_set(traced: TracedGraph, mode: str | Mapping[str, str]) -> tuple[str, ...]:
    """The forward nodes (in graph order) the backward computes again under ``mode``: one
    mode for every layer, or a mode per layer name (a layer absent: ``"none"``).

    ``"full"`` keeps only what a layer reads from outside it (its input, the
    parameters) and what other layers read of it (its output), and recomputes every
    value of the layer the backward reads;
    ``"selective"`` also keeps the outputs of matmuls and attention. A value is always
    kept when it draws random numbers or writes to a tensor (its recomputation would
    differ), or is an output of the model (the caller holds it anyway).
    """
    modes = mode.values() if isinstance(mode, Mapping) else [mode]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise PlanError(
            f"activation_checkpointing is {bad[0]!r}; use one of {', '.join(map(repr, MODES))}."
        )
    if all(m == "none" for m in modes):
        return ()
    outputs = {traced.node(n) for n in traced.outputs}
    forward = forward_part(outputs)

    def mode_of(layer: str | None) -> str:
        if layer is None:
            return "none"
        return mode.get(layer, "none") if isinstance(mode, Mapping) else mode

    def kept(node: fx.Node) -> bool:
        source = node.args[0] if node.target is operator.getitem else node
        if not isinstance(source, fx.Node) or source.op != "call_function":
            return True
        layer = layer_of(source)
        layer_mode = mode_of(layer)
        if layer_mode == "none" or node in outputs or source in outputs:
            return True
        # a value another layer reads is that layer's input: recomputed, the next
        # layer's recomputation would chain back through every layer before it
        if any(u in forward and layer_of(u) != layer for u in node.users):
            return True
        if torch.Tag.nondeterministic_seeded in getattr(source.target, "tags", ()):
            return True
        if mutates(source):
            return True
        return layer_mode == "selective" and _costly(source)

    stack = [
        n
        for n in forward
        if not kept(n) and any(u not in forward and u.op != "output" for u in n.users)
    ]
    chosen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node in chosen:
            continue
        chosen.add(node)
        layer = layer_of(node)
        stack += [a for a in node.all_input_nodes if layer_of(a) == layer and not kept(a)]
    return tuple(n.name for n in traced.gm.graph.nodes if n in chosen)


def layer_names(traced: TracedGraph) -> tuple[str, ...]:
    """The layers of ``traced`` (:func:`autoplan.core.graph.layer_of`), in forward order."""
    return tuple(dict.fromkeys(filter(None, map(layer_of, traced.gm.graph.nodes))))


def _costly(node: fx.Node) -> bool:
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    return any(name == op or name.startswith(f"_{op}") for op in _COSTLY)


def priced_recompute(costs: CostTable, names: Sequence[str]) -> CostTable:
    """``costs`` with each recomputed node's compute counted twice and each move into
    it priced twice (the copy moves its inputs again): an extra edge per input."""
    chosen = set(names)
    if not chosen:
        return costs
    doubled: dict[int, np.ndarray] = {}  # twins share their price arrays; keep that

    def twice(c: np.ndarray) -> np.ndarray:
        found = doubled.get(id(c))
        if found is None:
            found = doubled[id(c)] = c * 2
        return found

    compute = {v: twice(c) if v in chosen else c for v, c in costs.compute.items()}
    again = tuple(e for e in costs.edges if e.dst in chosen)
    return replace(costs, compute=compute, edges=costs.edges + again)


def checkpointed(
    traced: TracedGraph,
    table: StrategyTable,
    costs: CostTable,
    names: Sequence[str],
    *,
    counted: bool,
) -> tuple[CostTable, TracedGraph]:
    """``costs`` with recomputing ``names`` priced (:func:`priced_recompute`) and the
    activations the step then keeps (``activations``; in ``memory`` too when the budget
    ``counted`` them, with the outputs' gradients the backward holds,
    :func:`~autoplan.memory.activations.cotangent_memory`), and the graph the applied module
    runs (:func:`with_recompute`)."""
    costs = priced_recompute(costs, names)
    stepped = with_recompute(traced, names)
    kept = activation_memory(stepped, table)
    memory = costs.memory
    if counted:
        memory = dict(memory)
        for terms in (kept, cotangent_memory(traced, table)):
            for v, a in terms.items():
                memory[v] = memory[v] + a if v in memory else a
    return replace(costs, memory=memory, activations=kept), stepped


def stepped_moves(
    costs: CostTable, choice: dict[str, int], names: Sequence[str]
) -> tuple[CostTable, dict[str, int]]:
    """``costs`` (as :func:`priced_recompute` made it) and ``choice`` over the graph
    :func:`with_recompute` makes: each second move into a recomputed node goes into its
    copy, from the copy of its producer where that is recomputed too, and each copy
    takes its original's strategy."""
    chosen = set(names)
    if not chosen:
        return costs, choice
    again = sum(e.dst in chosen for e in costs.edges) // 2
    first, second = costs.edges[: len(costs.edges) - again], costs.edges[len(costs.edges) - again :]

    def copy(name: str) -> str:
        return f"{name}{_COPY}" if name in chosen else name

    edges = first + tuple(replace(e, src=copy(e.src), dst=copy(e.dst)) for e in second)
    return replace(costs, edges=edges), choice | {copy(v): choice[v] for v in chosen}


def with_recompute(traced: TracedGraph, names: Sequence[str]) -> TracedGraph:
    """A copy of ``traced`` whose backward computes each of ``names`` again, just before
    its first reader there, from what the forward keeps; the backward reads the copies.
    Each copy is named ``<original>_recompute`` and records its original
    (:func:`autoplan.core.graph.source_name`). The forward is unchanged."""
    if not names:
        return traced
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    result = graph.graph_copy(traced.gm.graph, env)
    graph.output(result)
    by_name = {n.name: n for n in graph.nodes}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise PlanError(
            f"the plan recomputes nodes this graph does not have (first: {unknown[:3]}); "
            "plan this exact model, then apply that plan."
        )
    chosen = [by_name[n] for n in names]
    forward = forward_part(by_name[n] for n in traced.outputs)
    # the backward's ops autograd records during the forward (detaches of values it
    # saves) move to just before their first reader: a copy placed before its first
    # reader must not land in the forward, where the split would keep its result
    nodes = list(graph.nodes)
    place: dict[fx.Node, float] = {n: i for i, n in enumerate(nodes)}
    last = max(i for i, n in enumerate(nodes) if n in forward)
    for node in reversed(nodes[:last]):
        if node not in forward and node.op != "placeholder" and node.users:
            reader = min(node.users, key=place.__getitem__)
            reader.prepend(node)
            place[node] = place[reader] - 0.5
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    # the first backward op that needs each chosen value, directly or through a copy
    first: dict[fx.Node, int] = {}
    for node in sorted(chosen, key=order.__getitem__, reverse=True):
        readers = [order[u] for u in node.users if u not in forward and u.op != "output"]
        readers += [first[u] for u in node.users if u in first]
        first[node] = min(readers)
    copies: dict[fx.Node, fx.Node] = {}
    made: set[fx.Node] = set()
    for node in sorted(chosen, key=order.__getitem__):
        with graph.inserting_before(nodes[first[node]]):
            args, kwargs = fx.map_arg((node.args, node.kwargs), lambda a: copies.get(a, a))
            copy = graph.create_node(node.op, node.target, args, kwargs, name=f"{node.name}{_COPY}")
        copy.meta = dict(node.meta) | {RECOMPUTES: node.name}
        copies[node] = copy
        made.add(copy)
    for node, copy in copies.items():
        for user in list(node.users):
            if user not in forward and user.op != "output" and user not in made:
                user.replace_input_with(node, copy)
    with use_lazy_graph_module(True):  # its code is generated when first run, if ever
        gm = make_graph_module(traced.gm, graph)
    return replace(traced, gm=gm)
