"""The ``mm_mode="einsum"`` graph pass: flattened Linear matmuls become einsums.

Stage: ``rewrite/``, run after tracing and before strategy enumeration.
Input: the joint forward+backward ``GraphModule`` from ``make_fx`` (pure aten,
every node has ``meta["val"]``). Output: the same module, mutated in place,
plus a frozen :class:`RewriteStats`.

Why: PyTorch lowers a Linear on a ``[*b, K]`` input to
``view([*b, K] -> [prod b, K]) -> mm -> view([prod b, N] -> [*b, N])``. The
flatten merges the batch and sequence dims into one, so a solver that reads
the ``mm`` can shard that merged dim only as a whole and never sees sequence
parallelism (batch on one mesh axis, sequence on another). As an einsum over
the un-flattened tensors every dim keeps its own letter and its own sharding
choices. The three products of one Linear are rewritten::

    forward      view(x) @ w2d -> view           einsum("abk,kn->abn", [x, w2d])
    grad-input   view(g) @ w2d.T -> view         einsum("abn,nk->abk", [g, w2d.T])
    grad-weight  t(view(g)) @ view(x) (-> t)     einsum("abn,abk->nk", [g, x])

(letters ``a``, ``b``, ... name the batch dims, ``k``/``n`` the in/out
features, so they never collide). The grad-weight einsum absorbs transposes
that follow it by swapping its output letters. Which of two structurally equal
flattened matmuls is the forward and which the grad-input only changes the
letters and the counts, never the result: a matmul counts as a grad-input
when its weight operand is the transpose of another matmul's weight operand.

The matchers are conservative; anything else is left as a plain ``mm`` and
the reason is recorded in :attr:`RewriteStats.reasons`: the flatten view
merges exactly all leading dims of a rank >= 3 tensor and keeps the last, the
unflatten view is its exact inverse (same batch dims), the weight operand is
2-D ``[K, N]``, both flattens of a grad-weight have equal batch dims,
transposes are exactly dims ``[1, 0]``, and every shape involved is made of
plain ints: traces with symbolic shapes (SymInt) do not match at all.

Pairing: ``make_fx`` sets no ``seq_nr``, so nothing links a forward op to its
backward ops. Every einsum this pass creates carries
``meta["autoplan_linear_id"]``, an int shared by the forward einsum and its two
backward einsums (keyed by the weight the forward reads, stripped of
transposes; a weight reused by several matmuls gives them all one id). Later
stages use it where AOTAutograd graphs would use ``seq_nr``; ``seq_nr`` itself
is copied from the ``mm`` only when the trace had one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule, Node

from autoplan.core.graph import arg_int, arg_ints, arg_node, arg_nodes, arg_str
from autoplan.core.torch_adapter import FakeTensor, FakeTensorMode, extract_tensor_metadata

__all__ = ["RewriteStats", "rewrite_linear_to_einsum"]

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default)
_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)
# Batch dims take these letters in order; "k" and "n" are kept for features.
_BATCH_LETTERS = "abcdefghijlmopqrstuvwxyz"
_COPIED_META = ("stack_trace", "nn_module_stack", "seq_nr", "custom")


@dataclass(frozen=True)
class RewriteStats:
    """What :func:`rewrite_linear_to_einsum` did to one graph."""

    forward: int = 0
    """Forward ``view -> mm -> view`` chains rewritten."""
    grad_input: int = 0
    """Grad-input ``view -> mm -> view`` chains rewritten."""
    grad_weight: int = 0
    """Grad-weight ``t(view) @ view`` products rewritten."""
    skipped: int = 0
    """``aten.mm`` nodes left alone."""
    reasons: tuple[str, ...] = ()
    """One ``"<mm node>: <why>"`` line per skipped ``mm``, in graph order."""

    def __str__(self) -> str:
        return (
            f"einsum rewrite: {self.forward} forward, {self.grad_input} grad_input, "
            f"{self.grad_weight} grad_weight, {self.skipped} skipped"
        )


class _Skip(Exception):
    """A matcher's reason for leaving an ``mm`` alone."""


@dataclass
class _Match:
    kind: str  # "forward", "grad_input" or "grad_weight"
    equation: str
    operands: list[Node]
    replaced: list[Node]  # nodes whose uses the einsum takes over
    dead: list[Node]  # nodes to erase once unused, users before inputs
    linear_id: int


class _Pairing:
    """Roles and linear ids read from the graph before it is rewritten."""

    def __init__(self, graph: Graph) -> None:
        matmuls = []
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is aten.mm.default:
                matmuls.append((node.args[0], node.args[1]))
            elif node.target is aten.addmm.default:  # a biased Linear's forward
                matmuls.append((node.args[1], node.args[2]))
        self.weights = {rhs for _, rhs in matmuls}
        self.forward_flattens: set[Node] = set()
        self.flatten_ids: dict[Node, int] = {}
        self._ids: dict[Node, int] = {}
        for lhs, rhs in matmuls:
            if not (isinstance(lhs, Node) and lhs.target in _VIEWS):
                continue
            self.flatten_ids.setdefault(lhs, self.id_of(_weight_root(rhs)))
            if not self.is_grad_input(rhs):
                self.forward_flattens.add(lhs)

    def id_of(self, key: Node) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def is_grad_input(self, weight: Node) -> bool:
        """A grad-input product reads the transpose of a forward's weight."""
        return _transpose_input_or_none(weight) in self.weights


def rewrite_linear_to_einsum(gm: GraphModule) -> RewriteStats:
    """Rewrite the flattened matmuls of Linears in ``gm`` into einsums, in place.

    Returns the counts of rewritten forward, grad-input and grad-weight
    products and, for every ``aten.mm`` left alone, the reason.
    """
    graph = gm.graph
    pairing = _Pairing(graph)
    counts = {"forward": 0, "grad_input": 0, "grad_weight": 0}
    reasons: list[str] = []
    cache: dict = {}
    mms = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.mm.default]
    for mm in mms:
        try:
            match = _match(mm, pairing)
        except _Skip as skip:
            reasons.append(f"{mm.name}: {skip}")
            continue
        _apply(graph, mm, match, cache)
        counts[match.kind] += 1
    graph.lint()
    gm.recompile()
    return RewriteStats(**counts, skipped=len(reasons), reasons=tuple(reasons))


def _match(mm: Node, pairing: _Pairing) -> _Match:
    lhs, rhs = mm.args
    if not isinstance(lhs, Node) or not isinstance(rhs, Node):
        raise _Skip("mm operands are not graph nodes")
    if lhs.target in _TRANSPOSES:
        return _match_grad_weight(mm, lhs, rhs, pairing)
    return _match_flat_matmul(mm, lhs, rhs, pairing)


def _match_flat_matmul(mm: Node, lhs: Node, rhs: Node, pairing: _Pairing) -> _Match:
    """``view([*b, K] -> [M, K]) @ w[K, N] -> view([M, N] -> [*b, N])``."""
    src, batch = _flatten_input(lhs)
    k = _shape(src)[-1]
    w_shape = _shape(rhs)
    if len(w_shape) != 2 or w_shape[0] != k:
        raise _Skip(f"weight {rhs.name} has shape {list(w_shape)}, not 2-D [{k}, N]")
    out = (*batch, w_shape[1])
    if not mm.users:
        raise _Skip("mm has no users")
    for user in mm.users:
        if user.target not in _VIEWS:
            raise _Skip(f"mm output is used by {user.name} ({_kind(user)}), not only by views")
        user_shape = _shape(user)
        if user_shape != out:
            raise _Skip(
                f"unflatten {user.name} {list(_shape(mm))} -> {list(user_shape)} "
                f"does not restore batch dims {list(batch)}"
            )
    letters = _BATCH_LETTERS[: len(batch)]
    if pairing.is_grad_input(rhs):
        kind, equation = "grad_input", f"{letters}n,nk->{letters}k"
    else:
        kind, equation = "forward", f"{letters}k,kn->{letters}n"
    return _Match(
        kind=kind,
        equation=equation,
        operands=[src, rhs],
        replaced=list(mm.users),
        dead=[mm, lhs],
        linear_id=pairing.id_of(_weight_root(rhs)),
    )


def _match_grad_weight(mm: Node, lhs: Node, rhs: Node, pairing: _Pairing) -> _Match:
    """``t(view([*b, P] -> [M, P])) @ view([*b, Q] -> [M, Q]) -> [P, Q]``."""
    flat_a = _transpose_input(lhs)
    src_a, batch_a = _flatten_input(flat_a)
    src_b, batch_b = _flatten_input(rhs)
    if batch_a != batch_b:
        raise _Skip(
            f"batch dims {list(batch_a)} of {src_a.name} and {list(batch_b)} of {src_b.name} differ"
        )
    letters = _BATCH_LETTERS[: len(batch_a)]
    if flat_a in pairing.forward_flattens:  # t(view(x)) @ view(g)
        equation, flat_g, flat_x = f"{letters}k,{letters}n->kn", rhs, flat_a
    else:  # t(view(g)) @ view(x)
        equation, flat_g, flat_x = f"{letters}n,{letters}k->nk", flat_a, rhs
    # The grad's flatten belongs to this Linear alone; the input's may be shared.
    linear_id = pairing.flatten_ids.get(flat_g, pairing.flatten_ids.get(flat_x))
    return _Match(
        kind="grad_weight",
        equation=equation,
        operands=[src_a, src_b],
        replaced=[mm],
        dead=[mm, lhs, flat_a, rhs],
        linear_id=pairing.id_of(mm) if linear_id is None else linear_id,
    )


def _apply(graph: Graph, mm: Node, match: _Match, cache: dict) -> None:
    """Insert the einsum, hand it the uses of ``match.replaced``, drop dead nodes."""
    with graph.inserting_before(mm):
        einsum = graph.call_function(aten.einsum.default, (match.equation, match.operands))
    for key in _COPIED_META:
        if key in mm.meta:
            einsum.meta[key] = mm.meta[key]
    einsum.meta["autoplan_linear_id"] = match.linear_id
    _set_val(einsum, had_tensor_meta="tensor_meta" in mm.meta, cache=cache)
    for node in match.replaced:
        node.replace_all_uses_with(einsum)
        if node is not mm:
            graph.erase_node(node)
    if match.kind == "grad_weight":
        _absorb_transposes(graph, einsum, cache)
    for node in dict.fromkeys(match.dead):  # x.T @ x names one flatten twice
        if not node.users:
            graph.erase_node(node)


def _absorb_transposes(graph: Graph, einsum: Node, cache: dict) -> None:
    """Fold ``t(einsum(... -> pq))`` into ``einsum(... -> qp)`` while it is the only user."""
    while len(einsum.users) == 1:
        (user,) = einsum.users
        if _transpose_input_or_none(user) is not einsum:
            return
        inputs, out = arg_str(einsum, 0).split("->")
        einsum.args = (f"{inputs}->{out[::-1]}", einsum.args[1])
        _set_val(einsum, had_tensor_meta="tensor_meta" in einsum.meta, cache=cache)
        user.replace_all_uses_with(einsum)
        graph.erase_node(user)


def _set_val(einsum: Node, *, had_tensor_meta: bool, cache: dict) -> None:
    """Recompute ``meta["val"]``: the einsum run on meta tensors laid out as the
    operands' values, its result made a fake value of their mode. On meta the op
    decomposes in C++; under a fake mode, in Python, about ten times slower.

    Identical layers ask the same question; ``cache`` (owned by one rewrite
    call) answers each (equation, layouts, mode) once, value and tensor metadata.
    """
    equation, operands = arg_str(einsum, 0), arg_nodes(einsum, 1)
    vals = [node.meta["val"] for node in operands]
    mode = next((v.fake_mode for v in vals if isinstance(v, FakeTensor)), None) or FakeTensorMode()
    key = (equation, id(mode), tuple((tuple(v.shape), v.stride(), v.dtype) for v in vals))
    found = cache.get(key)
    if found is None:
        metas = [_empty_like(v, device="meta") for v in vals]
        out = aten.einsum.default(equation, metas)
        with mode:
            val = _empty_like(out, device=vals[0].device)
        found = cache[key] = (val, extract_tensor_metadata(val))
    einsum.meta["val"] = found[0]
    if had_tensor_meta:
        einsum.meta["tensor_meta"] = found[1]


def _empty_like(val: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A tensor with ``val``'s layout on ``device``, made in the active mode, if any."""
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device)


def _shape(node: Node) -> tuple[int, ...]:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _Skip(f"{node.name} has no tensor meta['val']")
    if not all(type(s) is int for s in val.shape):
        raise _Skip(f"{node.name} has a symbolic shape {list(val.shape)}")
    return tuple(val.shape)


def _flatten_input(view: Node) -> tuple[Node, tuple[int, ...]]:
    """The input ``x`` and batch dims of a canonical ``view([*b, K] -> [prod b, K])``."""
    if view.target not in _VIEWS:
        raise _Skip(f"{view.name} ({_kind(view)}) is not a flatten view")
    src = arg_node(view, 0)
    in_shape, out_shape = _shape(src), _shape(view)
    if len(in_shape) < 3:
        raise _Skip(f"{src.name} has rank {len(in_shape)}: nothing to unflatten (rank >= 3)")
    batch = in_shape[:-1]
    if out_shape != (math.prod(batch), in_shape[-1]):
        raise _Skip(
            f"view {view.name} {list(in_shape)} -> {list(out_shape)} does not flatten "
            "exactly all leading dims and keep the last"
        )
    if len(batch) > len(_BATCH_LETTERS):
        raise _Skip(f"{src.name} has {len(batch)} batch dims, more than einsum letters")
    return src, batch


def _transpose_input(node: Node) -> Node:
    """The input of a 2-D transpose (``t``, ``permute [1, 0]``, ``transpose(0, 1)``)."""
    if node.target not in _TRANSPOSES:
        raise _Skip(f"{node.name} ({_kind(node)}) is not a transpose")
    if len(_shape(node)) != 2:
        raise _Skip(f"{node.name} is not 2-D")
    if node.target is aten.permute.default:
        dims = arg_ints(node, 1)
        if [d % 2 for d in dims] != [1, 0]:
            raise _Skip(f"{node.name} permutes dims {dims}, not [1, 0]")
    elif node.target is aten.transpose.int:
        if {arg_int(node, 1) % 2, arg_int(node, 2) % 2} != {0, 1}:
            raise _Skip(f"{node.name} transposes dims {list(node.args[1:])}, not (0, 1)")
    return arg_node(node, 0)


def _transpose_input_or_none(node: object) -> Node | None:
    if not isinstance(node, Node):
        return None
    try:
        return _transpose_input(node)
    except _Skip:
        return None


def _kind(node: Node) -> str:
    return str(node.target) if node.op == "call_function" else node.op


def _weight_root(node: Node) -> Node:
    """``node`` with any chain of 2-D transposes stripped (``t(t(w))`` -> ``w``)."""
    while (src := _transpose_input_or_none(node)) is not None:
        node = src
    return node
