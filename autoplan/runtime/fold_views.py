"""Stage 7, fold views: chains of view ops in a lowered program become at most two ops.

Input: one program of a :class:`~autoplan.runtime.lower.LoweredStep` (an ``fx.Graph`` of local
aten ops whose nodes carry their traced value in ``meta["val"]``). Output: the same
graph, rewritten in place, where each chain of aliasing ops (``view``, ``permute``,
``unsqueeze``, ``squeeze``, ``t``, ``transpose``, ``alias``, ``detach``) is replaced by
the identity, one ``view``, one ``permute``, or a ``permute`` then a ``view`` of the
chain's first input, and the intermediates nothing else reads are dropped.

Why: every op of an eager program is a Python call into the dispatcher, and a traced
einsum is mostly views (an einsum over 3-D activations and a 2-D weight records seven
to reach its bmm and four after it), which a plain ``nn.Linear`` pays inside one C++
call. A fold is made only when it is the same function of the chain's input: applied
to a contiguous tensor of the input's shape, it addresses the same elements as the
chain (so the values agree on any layout, and a view that cannot be made raises as the
chain's would), and applied to the traced layout it gives the traced strides (so the
ops after it see the tensor they were recorded with).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx

from autoplan.core.graph import node_op, tensor_val

__all__ = ["fold_views"]

_aten = torch.ops.aten
# aliasing ops that keep the storage offset: a chain of them is a permute and a view
VIEWS = frozenset(
    {
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.permute.default,
        _aten.unsqueeze.default,
        _aten.squeeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.t.default,
        _aten.transpose.int,
        _aten.alias.default,
        _aten.detach.default,
    }
)

_Fold = tuple[tuple[int, ...] | None, tuple[int, ...] | None]  # (permutation, view shape)


def fold_views(graph: fx.Graph) -> int:
    """Replace every chain of :data:`VIEWS` ops in ``graph`` by its shortest equal form;
    returns how many nodes the graph lost."""
    before = len(graph.nodes)
    root: dict[fx.Node, fx.Node] = {}  # a view node's chain input
    replay: dict[fx.Node, torch.Tensor] = {}  # the chain on a contiguous input
    length: dict[fx.Node, int] = {}  # ops from the chain input
    for node in list(graph.nodes):
        src = node.args[0] if node.op == "call_function" and node.target in VIEWS else None
        val = tensor_val(node)
        if not isinstance(src, fx.Node) or val is None or tensor_val(src) is None:
            continue
        first = root.get(src, src)
        first_val = tensor_val(first)
        assert first_val is not None, "a chain starts at a tensor: src, or a chain's root"
        start = replay[src] if src in root else _contiguous(first_val)
        again = _apply(node, start)
        if again is None:  # not a function of a contiguous chain input: a new chain starts
            continue
        root[node], replay[node], length[node] = first, again, length.get(src, 0) + 1
        fold = _fold(first_val, val, replay[node])
        # a program's outputs keep their nodes: its signature and saved list name them
        returned = any(u.op == "output" for u in node.users)
        if fold is not None and _length(fold) < length[node] and not returned:
            out = _replace(graph, node, first, fold)
            if out is not first:  # later views continue the chain from the fold
                root[out], replay[out], length[out] = first, replay[node], _length(fold)
    graph.eliminate_dead_code()
    return before - len(graph.nodes)


def _contiguous(val: torch.Tensor) -> torch.Tensor:
    return torch.empty(val.shape, dtype=val.dtype, device="meta")


def _apply(node: fx.Node, x: torch.Tensor) -> torch.Tensor | None:
    """``node``'s op on the meta tensor ``x``, or None when it cannot run there."""
    try:
        return node_op(node)(x, *node.args[1:], **node.kwargs)
    except RuntimeError:  # a view the traced layout allowed and a contiguous one does not
        return None


def _length(fold: _Fold) -> int:
    return sum(part is not None for part in fold)


def _fold(first: torch.Tensor, last: torch.Tensor, replay: torch.Tensor) -> _Fold | None:
    """The shortest (permutation, view shape) taking ``first`` to ``last``, or None."""
    shape = tuple(last.shape)
    perm = _permutation(first, replay)
    candidates: list[_Fold] = [(None, None), (None, shape)]
    if perm is not None:
        candidates += [(perm, None), (perm, shape)]
    for fold in candidates:
        if _same_elements(_run(fold, _contiguous(first)), replay) and _same_layout(
            _run(fold, torch.empty_strided(first.shape, first.stride(), device="meta")), last
        ):
            return fold
    return None


def _permutation(first: torch.Tensor, replay: torch.Tensor) -> tuple[int, ...] | None:
    """The order of ``first``'s dims in which the chain lays them out: each dim placed by
    the result dim whose elements it steps through (size-1 dims last)."""
    strides = _contiguous(first).stride()
    result = [(s, n) for s, n in zip(replay.stride(), replay.shape, strict=True) if n > 1]
    keys = []
    for i, size in enumerate(first.shape):
        if size == 1:
            keys.append((len(result), 0, i))
            continue
        owner = next(
            (
                j
                for j, (s, n) in enumerate(result)
                if s <= strides[i] < s * n and strides[i] % s == 0
            ),
            None,
        )
        if owner is None:
            return None
        keys.append((owner, -strides[i], i))
    perm = tuple(sorted(range(first.dim()), key=keys.__getitem__))
    return None if perm == tuple(range(first.dim())) else perm


def _run(fold: _Fold, x: torch.Tensor) -> torch.Tensor | None:
    perm, shape = fold
    try:
        if perm is not None:
            x = x.permute(perm)
        return x.view(shape) if shape is not None else x
    except RuntimeError:
        return None


def _same_elements(x: torch.Tensor | None, y: torch.Tensor) -> bool:
    """Same shape, and the same element at every index (strides of size-1 dims aside)."""
    return (
        x is not None
        and x.shape == y.shape
        and all(a == b for a, b, n in zip(x.stride(), y.stride(), y.shape, strict=True) if n > 1)
    )


def _same_layout(x: torch.Tensor | None, y: torch.Tensor) -> bool:
    return x is not None and x.shape == y.shape and x.stride() == y.stride()


def _replace(graph: fx.Graph, node: fx.Node, first: fx.Node, fold: _Fold) -> fx.Node:
    perm, shape = fold
    out = first
    with graph.inserting_before(node):
        for op, arg in ((_aten.permute.default, perm), (_aten.view.default, shape)):
            if arg is not None:
                out = _call(graph, op, out, list(arg))
    node.replace_all_uses_with(out)
    return out


def _call(graph: fx.Graph, op: Callable[..., torch.Tensor], x: fx.Node, arg: list[int]) -> fx.Node:
    made = graph.call_function(op, (x, arg))
    made.meta["val"] = op(tensor_val(x), arg)
    return made
