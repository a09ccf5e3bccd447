"""Reading traced aten graphs: the tensor arguments of a node, its arguments mapped or
read one at a time as the type its op's schema gives, and a digest of the whole graph.

Shared by the strategies and cost stages, which both replay a node's arguments
with something in place of each tensor (metadata, candidate strategies, meta
tensors of local shapes).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from autoplan.core.torch_adapter import OpOverload


def is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def tensor_val(node: object) -> torch.Tensor | None:
    """The traced tensor of ``node`` (``meta["val"]``), or None for anything else."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The tensor inputs of ``node``, in argument order (lists flattened, kwargs last)."""
    out: list[fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, fx.Node):
            if is_tensor_node(a):
                out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    for a in (*node.args, *node.kwargs.values()):
        visit(a)
    return out


# Typed reads of one positional argument. fx types every argument as the union of all
# it may hold; the op's schema says which one it is, and these check it.


def node_op(node: fx.Node) -> OpOverload:
    """The aten op ``node`` calls (a ``call_function`` node of an aten graph)."""
    op = node.target
    assert isinstance(op, OpOverload), f"{node.name} calls {op!r}, not an aten op"
    return op


def arg_node(node: fx.Node, i: int) -> fx.Node:
    """Argument ``i`` of ``node``, a graph node (a Tensor in the op's schema)."""
    arg = node.args[i]
    assert isinstance(arg, fx.Node), f"{node.name}: argument {i} is {arg!r}, not a node"
    return arg


def arg_nodes(node: fx.Node, i: int) -> list[fx.Node]:
    """Argument ``i`` of ``node``, a list of graph nodes (a Tensor[] in the op's schema)."""
    arg = node.args[i]
    assert isinstance(arg, (list, tuple)) and all(isinstance(a, fx.Node) for a in arg), (
        f"{node.name}: argument {i} is {arg!r}, not a list of nodes"
    )
    return [a for a in arg if isinstance(a, fx.Node)]


def arg_int(node: fx.Node, i: int) -> int:
    """Argument ``i`` of ``node``, a plain int (an int or dim in the op's schema)."""
    arg = node.args[i]
    assert isinstance(arg, int), f"{node.name}: argument {i} is {arg!r}, not an int"
    return arg


def arg_ints(node: fx.Node, i: int) -> list[int]:
    """Argument ``i`` of ``node``, a list of plain ints (an int[] in the op's schema)."""
    arg = node.args[i]
    assert isinstance(arg, (list, tuple)) and all(isinstance(a, int) for a in arg), (
        f"{node.name}: argument {i} is {arg!r}, not a list of ints"
    )
    return [a for a in arg if isinstance(a, int)]


def arg_str(node: fx.Node, i: int) -> str:
    """Argument ``i`` of ``node``, a string (an einsum equation, a group name)."""
    arg = node.args[i]
    assert isinstance(arg, str), f"{node.name}: argument {i} is {arg!r}, not a str"
    return arg


def map_args(obj: Any, fn: Callable[[fx.Node], Any]) -> Any:
    """``obj`` (args, kwargs or nested) with each tensor node replaced by ``fn(node)``
    and each other node by its traced value."""
    if isinstance(obj, fx.Node):
        return fn(obj) if is_tensor_node(obj) else obj.meta.get("val")
    if isinstance(obj, tuple):
        return tuple(map_args(x, fn) for x in obj)
    if isinstance(obj, list):
        return [map_args(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: map_args(v, fn) for k, v in obj.items()}
    return obj


def static_args(node: fx.Node) -> str:
    """A key for the non-tensor arguments of ``node`` (sizes, dims, equations)."""
    return repr(map_args((node.args, dict(node.kwargs)), lambda n: "T"))


LAYER_KEY = "autoplan_layer"  # the key trace_joint tags a layer's forward nodes with


def layer_of(node: fx.Node) -> str | None:
    """The name of the layer (a child of an ``nn.ModuleList``) whose forward made
    ``node``, or None (outside every layer, or a backward node)."""
    return node.meta.get("custom", {}).get(LAYER_KEY)


RECOMPUTES = "autoplan_recomputes"  # a recomputed copy's meta key: its forward original


def source_name(node: fx.Node) -> str:
    """The name of the node whose planned strategy ``node`` runs with: its own, or for
    a copy the backward recomputes (:func:`autoplan.memory.recompute.with_recompute`) its
    original's."""
    return node.meta.get(RECOMPUTES, node.name)


def forward_part(outputs: Iterable[fx.Node]) -> set[fx.Node]:
    """The nodes of a joint graph a training step's forward runs: every ancestor of the
    model's ``outputs``, and every output of a multi-output op among them (attention's
    logsumexp, which only the backward reads, is kept rather than the op run again).
    The rest is the backward; a forward node with a backward user is saved for it."""
    forward = set(outputs)
    stack = list(forward)
    while stack:
        for arg in stack.pop().all_input_nodes:
            if arg not in forward:
                forward.add(arg)
                stack.append(arg)
    return forward | {u for n in forward for u in n.users if u.target is operator.getitem}


def fingerprint(gm: fx.GraphModule) -> str:
    """A digest of ``gm``'s graph: every node's op, arguments and output shapes and dtypes,
    in order.

    A plan records it; applying the plan compares it with the digest of its own trace,
    so a plan is never run on another graph (another loss, model or dtype).
    """
    index: dict[fx.Node, int] = {}
    digest = hashlib.sha256()
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        args = fx.node.map_arg((node.args, dict(node.kwargs)), lambda n: f"%{index[n]}")
        digest.update(f"{node.op}|{node.target}|{args}|{_out_signature(node)}\n".encode())
    return digest.hexdigest()


def _out_signature(node: fx.Node) -> str:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return ";".join(
        f"{tuple(v.shape)}:{v.dtype}" if isinstance(v, torch.Tensor) else type(v).__name__
        for v in vals
    )
