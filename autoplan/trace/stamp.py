"""Stage 1, trace (stamping): a deep stack of alike layers traced as four, then stamped.

Input: the raw ``make_fx`` joint graph of a model whose layer stack
(:func:`autoplan.trace.layers.layer_stack`: one top-level ``nn.ModuleList`` of alike
layers) held only its first four layers while it was traced
(:func:`autoplan.trace.layers.truncated`); :func:`stamp` writes it out to the full
depth. Output: the graph a trace of the whole model would have made (same nodes in
the same order, the same names, arguments and fake values), or False when the
four-layer graph does not have the shape stamping needs (the caller traces in full).

Why: the layers of a transformer trace into the same ops, and ``make_fx`` pays its
per-op Python for each of them (LLaMA3-8B: most of the plan's wall time was the trace).
The first layer reads the embedding, the last feeds the head, and the one before the
last reads the last's gradient where the others read a layer's, so four layers give
every kind; layer 1 is stamped for the rest. Forward nodes carry their layer's tag
(:func:`autoplan.core.graph.layer_of`); in the backward, a layer's *core* runs from the
first to the last node that reads that layer's forward nodes or parameters, and the
*gap* before it (the nodes between the next layer's core and its own) is its too. A
node's arguments are addressed relative to its own layer, and layer 1 must read its
neighbours exactly as they read theirs (checked here, else False): then layer ``j`` is
layer 1 shifted by ``j - 1``. Tests compare stamped graphs with full traces
(fingerprint and names); a run does not trace in full to check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from autoplan.core.graph import LAYER_KEY, layer_of
from autoplan.core.torch_adapter import pytree
from autoplan.trace.layers import TEMPLATE_LAYERS, LayerStack

__all__ = ["stamp"]

_NUMBERED = re.compile(r"^(.*)_(\d+)$")

Address = tuple[Any, ...]  # (kind, layer, position) of a layer node; kind F, G or C


def _layer(fqn: str, prefix: str) -> tuple[int, str] | None:
    """(index, rest) of ``prefix.index.rest``, or None outside the stack."""
    head = f"{prefix}."
    if not fqn.startswith(head):
        return None
    index, _, rest = fqn[len(head) :].partition(".")
    return int(index), rest


def _template_of(j: int, depth: int) -> int:
    """The template layer that layer ``j`` of ``depth`` is a copy of."""
    return 0 if j == 0 else 1 if j < depth - 2 else j - depth + TEMPLATE_LAYERS


@dataclass
class _Template:
    """The raw four-layer graph cut into its layer segments."""

    nodes: list[fx.Node]
    address: dict[fx.Node, Address]  # a layer node's, or a layer parameter's ("P", layer, rest)
    segments: dict[tuple[str, int], list[fx.Node]]  # (kind, layer) -> its nodes in order


def _cut(graph: fx.Graph, prefix: str, placeholder_fqns: dict[fx.Node, str]) -> _Template | None:
    nodes = list(graph.nodes)
    address: dict[fx.Node, Address] = {}
    for node, fqn in placeholder_fqns.items():
        where = _layer(fqn, prefix)
        if where is not None:
            address[node] = ("P", *where)
    first_op = next(i for i, n in enumerate(nodes) if n.op != "placeholder")
    late = [i for i in range(first_op, len(nodes)) if nodes[i].op == "placeholder"]
    if not late:
        return None
    first_tangent = late[0]  # the forward is what ran before the cotangents were made
    segments: dict[tuple[str, int], list[fx.Node]] = {}
    order: list[int] = []
    for node in nodes[:first_tangent]:
        tag = layer_of(node)
        if tag is None:
            continue
        where = _layer(tag, prefix)
        if where is None or where[1]:
            return None
        layer = where[0]
        if not order or order[-1] != layer:
            order.append(layer)
        segments.setdefault(("F", layer), []).append(node)
    if order != list(range(TEMPLATE_LAYERS)):
        return None  # the layers did not run once each, in order
    span = [n for n in nodes[:first_tangent] if layer_of(n) is not None]
    lo, hi = nodes.index(span[0]), nodes.index(span[-1])
    if hi - lo + 1 != len(span):
        return None  # an untagged node between layers
    for (kind, layer), seg in segments.items():
        for pos, n in enumerate(seg):
            address[n] = (kind, layer, pos)
    # a layer's output is read by the next layer's backward too: only what nothing
    # outside the layer reads in the forward marks the layer's own backward
    handed = {
        arg
        for node in nodes[:first_tangent]
        for arg in node.all_input_nodes
        if arg in address
        and address[arg][0] == "F"
        and address.get(node, (0, -1))[1] != address[arg][1]
    }
    backward = nodes[first_tangent:]
    reads: dict[int, list[int]] = {}
    for i, node in enumerate(backward):
        for arg in node.all_input_nodes:
            a = address.get(arg)
            if a is not None and a[0] in ("F", "P") and arg not in handed:
                reads.setdefault(a[1], []).append(i)
    if sorted(reads) != list(range(TEMPLATE_LAYERS)):
        return None
    cores = {layer: (min(ix), max(ix)) for layer, ix in reads.items()}
    for layer in range(TEMPLATE_LAYERS - 1):
        if cores[layer + 1][1] >= cores[layer][0]:
            return None  # the layers' backward interleaves
    for layer in range(TEMPLATE_LAYERS):
        lo_c, hi_c = cores[layer]
        segments[("C", layer)] = backward[lo_c : hi_c + 1]
        if layer < TEMPLATE_LAYERS - 1:
            segments[("G", layer)] = backward[cores[layer + 1][1] + 1 : lo_c]
    for key, seg in segments.items():
        if key[0] != "F":
            for pos, n in enumerate(seg):
                address[n] = (key[0], key[1], pos)
    return _Template(nodes, address, segments)


def _head(node: fx.Node) -> Any:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    shapes = tuple((tuple(v.shape), v.dtype) for v in vals if isinstance(v, torch.Tensor))
    return node.op, node.target, shapes


def _arguments(t: _Template, node: fx.Node, layer: int) -> list[Any]:
    """``node``'s arguments, flat; a layer node as (kind, layer offset, position)."""

    def rel(n: fx.Node) -> Any:
        a = t.address.get(n)
        return _Rel("shared", 0, n.name) if a is None else _Rel(a[0], a[1] - layer, a[2])

    return pytree.tree_leaves(fx.node.map_arg((node.args, node.kwargs), rel))


@dataclass(frozen=True)
class _Rel:
    kind: str
    offset: int
    at: Any


def _regular(t: _Template) -> bool:
    """The interior template (layer 1) computes what layers 0 and 2 compute, and reads
    its neighbours as they read theirs: its previous layer as layer 2 reads its previous,
    its next layer (and its own gap, which the next layer's backward hands it) as layer 0
    reads its next. Layer 0 has no previous; layer 2's next is the last layer, whose gap
    lies outside the stack: there they read what is outside."""
    for kind in ("F", "C", "G"):
        segs = [t.segments.get((kind, layer), []) for layer in range(3)]
        if len({len(seg) for seg in segs}) != 1:
            return False
        for pos, node in enumerate(segs[1]):
            mine = _arguments(t, node, 1)
            for layer in (0, 2):
                other = segs[layer][pos]
                theirs = _arguments(t, other, layer)
                if _head(other) != _head(node) or len(theirs) != len(mine):
                    return False
                for x, y in zip(mine, theirs, strict=True):
                    if x == y:
                        continue
                    if not isinstance(x, _Rel):
                        return False
                    ahead = x.offset == 1 or (x.kind, x.offset) == ("G", 0)
                    if not ((layer == 0 and x.offset == -1) or (layer == 2 and ahead)):
                        return False
    return True


def stamp(
    gm: fx.GraphModule,
    stack: LayerStack,
    template: tuple[Sequence[str], Sequence[str]],
    full: tuple[Sequence[str], Sequence[str]],
) -> bool:
    """Rewrite ``gm``'s raw four-layer joint graph into the graph of all ``stack.depth``
    layers; False (``gm`` untouched) when it cannot be stamped.

    ``template`` and ``full`` are the (parameter, buffer) names of the four-layer and
    the whole model; the raw graph's placeholders are the template's parameters, its
    buffers and the inputs, with the cotangents where ``make_fx`` made them."""
    graph = gm.graph
    t_fqns = [*template[0], *template[1]]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    fqn_of = dict(zip(placeholders, t_fqns, strict=False))
    t = _cut(graph, stack.prefix, fqn_of)
    if t is None or not _regular(t):
        return False
    names = _placeholder_names(placeholders, template, full)
    if names is None:
        return False
    by_fqn = {fqn: n for n, fqn in fqn_of.items()}
    depth = stack.depth
    new = fx.Graph()
    made: dict[Address, fx.Node] = {}  # (kind, full layer, position) or ("P", layer, rest)
    shared: dict[fx.Node, fx.Node] = {}

    def mapper(shift: int | None) -> Any:
        """Template node -> stamped node; ``shift`` is the layer offset of the node being
        stamped, or None for a node outside the layers (it reads the first or the last)."""

        def arg(n: fx.Node) -> fx.Node:
            a = t.address.get(n)
            if a is None:
                found = shared.get(n)
            elif shift is not None:
                found = made.get((a[0], a[1] + shift, a[2]))
            elif a[1] in (0, TEMPLATE_LAYERS - 1):
                found = made.get((a[0], 0 if a[1] == 0 else depth - 1, a[2]))
            else:  # outside the layers, reading the interior template
                found = None
            if found is None:  # read before it is made: the order is not a layer stack's
                raise _Irregular
            return found

        return arg

    def emit(node: fx.Node, shift: int | None, key: Address | None, name: str | None) -> None:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), mapper(shift))
        # a placeholder's target is its name
        target = name if node.op == "placeholder" and name else node.target
        out = new.create_node(node.op, target, args, kwargs, name)
        out.meta = dict(node.meta)
        if key is None:
            shared[node] = out
            return
        made[key] = out
        custom = node.meta.get("custom")
        if key[0] != "P" and custom and LAYER_KEY in custom:
            out.meta["custom"] = {**custom, LAYER_KEY: f"{stack.prefix}.{key[1]}"}

    def emit_layer(kind: str, j: int) -> None:
        tl = _template_of(j, depth)
        for pos, node in enumerate(t.segments[(kind, tl)]):
            emit(node, j - tl, (kind, j, pos), _base(node.name))

    layer_nodes = {n for seg in t.segments.values() for n in seg}
    first_forward = t.segments[("F", 0)][0]
    first_backward = t.segments[("C", TEMPLATE_LAYERS - 1)][0]
    try:
        for fqn, name in zip([*full[0], *full[1]], names, strict=True):
            where = _layer(fqn, stack.prefix)
            if where is None:
                emit(by_fqn[fqn], None, None, name)
            else:
                src = by_fqn[f"{stack.prefix}.{_template_of(where[0], depth)}.{where[1]}"]
                emit(src, None, ("P", *where), name)
        for node in t.nodes[len(t_fqns) :]:
            if node is first_forward:
                for j in range(depth):
                    emit_layer("F", j)
            elif node is first_backward:
                for j in reversed(range(depth)):
                    if j < depth - 1:
                        emit_layer("G", j)
                    emit_layer("C", j)
            elif node.op == "output":
                _emit_output(new, node, template[0], full[0], stack, mapper)
            elif node not in layer_nodes:
                emit(node, None, None, node.name if node.op == "placeholder" else _base(node.name))
    except _Irregular:
        return False
    gm.graph = new
    return True


class _Irregular(Exception):
    """A stamped node would read the interior template layer from outside the layers,
    or a node not made yet."""


def _emit_output(
    new: fx.Graph,
    node: fx.Node,
    template_params: Sequence[str],
    full_params: Sequence[str],
    stack: LayerStack,
    mapper: Any,
) -> None:
    """The outputs, then one gradient per parameter of the whole model: a layer's from
    its template layer's, shifted."""
    (flat,) = node.args
    assert isinstance(flat, (list, tuple)), "make_fx returns the step's outputs flat"
    n_outs = len(flat) - len(template_params)
    index = {fqn: i for i, fqn in enumerate(template_params)}
    outs = [fx.node.map_arg(x, mapper(None)) for x in flat[:n_outs]]
    grads = []
    for fqn in full_params:
        where = _layer(fqn, stack.prefix)
        if where is None:
            src, shift = fqn, None
        else:
            tl = _template_of(where[0], stack.depth)
            src, shift = f"{stack.prefix}.{tl}.{where[1]}", where[0] - tl
        g = flat[n_outs + index[src]]
        grads.append(None if g is None else mapper(shift)(g))
    out = new.output(type(flat)([*outs, *grads]))
    out.meta = dict(node.meta)


def _base(name: str) -> str:
    m = _NUMBERED.match(name)
    return m.group(1) if m else name


def _placeholder_names(
    placeholders: list[fx.Node],
    template: tuple[Sequence[str], Sequence[str]],
    full: tuple[Sequence[str], Sequence[str]],
) -> list[str] | None:
    """make_fx numbers each flattened argument list from 1 (``ps_1``, ``bs_1``): the whole
    model's parameters and buffers continue their list's numbering."""
    out: list[str] = []
    at = 0
    for t_names, f_names in zip(template, full, strict=True):
        group = placeholders[at : at + len(t_names)]
        at += len(t_names)
        bases = {_base(n.name) for n in group}
        if [n.name for n in group] != [
            f"{b}_{i + 1}" for i, b in enumerate(_base(n.name) for n in group)
        ]:
            return None
        if len(bases) > 1 or (not group and f_names):
            return None
        base = bases.pop() if bases else ""
        out += [f"{base}_{i + 1}" for i in range(len(f_names))]
    return out
