"""Reading traced aten graphs: the tensor arguments of a node, and its arguments mapped.

Shared by the strategies and cost stages, which both replay a node's arguments
with something in place of each tensor (metadata, candidate strategies, meta
tensors of local shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx


def is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


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
