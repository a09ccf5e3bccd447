"""Stage 1, trace (stamping): a deep stack of identical layers traced as three, then stamped.

Input: a model and, from :func:`layer_stack`, its one top-level ``nn.ModuleList`` when
every layer in it has the same structure (module types, parameter and buffer shapes,
plain attributes, no hooks). :func:`truncated` hides all but the first three layers while
``make_fx`` records the joint graph; :func:`stamp` then writes that raw graph out to the
full depth. Output: the graph a trace of the whole model would have made (same nodes in
the same order, the same names, arguments and fake values), or ``None`` when the
three-layer graph does not have the shape stamping needs (the caller traces in full).

Why: the layers of a transformer trace into the same ops, and ``make_fx`` pays its
per-op Python for each of them (LLaMA3-8B: most of the plan's wall time is the trace).
The first layer reads the embedding and the last feeds the head, so three layers give a
first, an interior and a last template. Forward nodes carry their layer's tag
(:func:`autoplan.core.graph.layer_of`); in the backward, a layer's *core* runs from the
first to the last node that reads that layer's forward nodes or parameters, and the
*gap* before it (the nodes between the next layer's core and its own) is its too. A
node's arguments are addressed relative to its own layer, and the interior layer must
read its neighbours exactly as its neighbours read theirs (checked here, else ``None``):
then layer ``j`` is layer 1 shifted by ``j - 1``. Tests compare stamped graphs with
full traces (fingerprint and names); a run does not trace in full to check.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from autoplan.core.graph import LAYER_KEY, layer_of
from autoplan.core.torch_adapter import pytree

__all__ = ["TEMPLATE_LAYERS", "LayerStack", "layer_stack", "stamp", "truncated"]

TEMPLATE_LAYERS = 3
"""A first, an interior and a last layer."""
_MIN_DEPTH = TEMPLATE_LAYERS + 1  # at three layers or fewer, stamping saves nothing
# nn.Module's own bookkeeping, compared through the parameters, buffers and hooks instead
_MODULE_STATE = frozenset(vars(nn.Module())) - {"training"}
_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_NUMBERED = re.compile(r"^(.*)_(\d+)$")

Address = tuple[Any, ...]  # (kind, layer, position) of a layer node; kind F, G or C


@dataclass(frozen=True)
class LayerStack:
    """The ``nn.ModuleList`` at ``prefix`` whose ``depth`` layers are stamped."""

    prefix: str
    layers: nn.ModuleList
    depth: int


def layer_stack(model: nn.Module) -> LayerStack | None:
    """The model's one top-level layer list, when it is deep and its layers are alike."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    top = [(n, m) for n, m in lists if not any(n.startswith(f"{o}.") for o, _ in lists)]
    if len(top) != 1 or not top[0][0] or _global_hooks():
        return None
    prefix, layers = top[0]
    if len(layers) < _MIN_DEPTH or any(name != str(i) for i, name in enumerate(layers._modules)):
        return None
    template = layers[1]
    if not all(_alike(template, layer, 1, j) for j, layer in enumerate(layers)):
        return None
    return LayerStack(prefix, layers, len(layers))


def _global_hooks() -> bool:
    hooks = nn.modules.module
    return any(
        getattr(hooks, name, None)
        for name in (
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
        )
    )


def _alike(a: nn.Module, b: nn.Module, ia: int, ib: int) -> bool:
    """Same module tree, tensors and plain attributes, and no hooks; an int attribute may
    differ when each holds its own layer's index (``layer_id``)."""
    ma, mb = list(a.named_modules()), list(b.named_modules())
    if [(n, type(m)) for n, m in ma] != [(n, type(m)) for n, m in mb]:
        return False
    for (_, x), (_, y) in zip(ma, mb, strict=True):
        if any(getattr(m, h) for m in (x, y) for h in _HOOKS):
            return False
        if not (
            _same_tensors(x._parameters, y._parameters) and _same_tensors(x._buffers, y._buffers)
        ):
            return False
        if not _same_attributes(x, y, ia, ib):
            return False
    return True


def _same_tensors(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def sig(t: torch.Tensor | None) -> Any:
        if t is None:
            return None
        return (t.shape, t.dtype, t.stride(), t.requires_grad, t.device.type)

    return a.keys() == b.keys() and all(sig(a[k]) == sig(b[k]) for k in a)


def _same_attributes(x: nn.Module, y: nn.Module, ix: int, iy: int) -> bool:
    va, vb = vars(x), vars(y)
    keys = va.keys() - _MODULE_STATE
    if keys != vb.keys() - _MODULE_STATE:
        return False
    for k in keys:
        p, q = va[k], vb[k]
        if p is q:
            continue
        if type(p) is int and type(q) is int and (p, q) == (ix, iy):
            continue
        try:
            if not bool(p == q):
                return False
        except Exception:  # a tensor or an object without a total ==: not provably alike
            return False
    return True


@contextlib.contextmanager
def truncated(stack: LayerStack) -> Iterator[None]:
    """The list holds only its first :data:`TEMPLATE_LAYERS` layers inside; restored on exit."""
    kept = stack.layers._modules
    stack.layers._modules = dict(list(kept.items())[:TEMPLATE_LAYERS])
    try:
        yield
    finally:
        stack.layers._modules = kept


def _layer(fqn: str, prefix: str) -> tuple[int, str] | None:
    """(index, rest) of ``prefix.index.rest``, or None outside the stack."""
    head = f"{prefix}."
    if not fqn.startswith(head):
        return None
    index, _, rest = fqn[len(head) :].partition(".")
    return int(index), rest


def _template_of(j: int, depth: int) -> int:
    return 0 if j == 0 else TEMPLATE_LAYERS - 1 if j == depth - 1 else 1


@dataclass
class _Template:
    """The raw three-layer graph cut into its layer segments."""

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
    """The interior layer computes what the first and the last compute, and reads its
    neighbours as they read theirs: the previous layer as the last layer reads its
    previous, the next (and its own gap, which the next layer's backward hands it) as
    the first layer reads its next. The first layer has no previous, the last no next
    and no gap: there they read what is outside the stack."""
    for kind in ("F", "C", "G"):
        segs = {L: t.segments[(kind, L)] for L in range(TEMPLATE_LAYERS) if (kind, L) in t.segments}
        if len({len(seg) for seg in segs.values()}) != 1:
            return False
        for pos, node in enumerate(segs[1]):
            mine = _arguments(t, node, 1)
            for L, seg in segs.items():
                other = seg[pos]
                theirs = _arguments(t, other, L)
                if L == 1:
                    continue
                if _head(other) != _head(node) or len(theirs) != len(mine):
                    return False
                for x, y in zip(mine, theirs, strict=True):
                    reads_past_end = isinstance(x, _Rel) and (
                        x.offset == -1 if L == 0 else x.offset == 1 or (x.kind, x.offset) == ("G", 0)
                    )
                    if x != y and not reads_past_end:
                        return False
                    if reads_past_end and TEMPLATE_LAYERS - 1 - L not in segs:
                        return False  # nothing shows the interior read right
    return True


def stamp(
    gm: fx.GraphModule,
    stack: LayerStack,
    template: tuple[Sequence[str], Sequence[str]],
    full: tuple[Sequence[str], Sequence[str]],
) -> bool:
    """Rewrite ``gm``'s raw three-layer joint graph into the graph of all ``stack.depth``
    layers; False (``gm`` untouched) when it cannot be stamped.

    ``template`` and ``full`` are the (parameter, buffer) names of the three-layer and
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
                return shared[n]
            if shift is not None:
                return made[(a[0], a[1] + shift, a[2])]
            if a[1] == 1:
                raise _Irregular
            return made[(a[0], 0 if a[1] == 0 else depth - 1, a[2])]

        return arg

    def emit(node: fx.Node, shift: int | None, key: Address | None, name: str | None) -> None:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), mapper(shift))
        target = name if node.op == "placeholder" else node.target  # a placeholder's is its name
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
    """A node outside the layers reads the interior template layer."""


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
