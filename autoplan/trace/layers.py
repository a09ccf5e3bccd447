"""Stage 1, trace (layers): which modules are a model's layers, and when they are alike.

Input: an ``nn.Module``. Output: :func:`marked_layers` tags each forward node a layer
makes with the layer's name while the model is traced (the unit activation
checkpointing recomputes and stamping copies); :func:`layer_stack` finds the one
top-level ``nn.ModuleList`` whose layers are alike (module types, parameter and buffer
shapes, plain attributes, no hooks), and :func:`truncated` hides all but its first
:data:`TEMPLATE_LAYERS` layers while :mod:`autoplan.trace.stamp`'s template is traced.

Why here: both read the model's module tree, not its graph; each scopes what it
changes to the trace (hooks removed, the layer list restored, even on an error).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.fx import traceback as fx_traceback

from autoplan.core.graph import LAYER_KEY
from autoplan.core.torch_adapter import global_module_hooks

__all__ = ["TEMPLATE_LAYERS", "LayerStack", "layer_stack", "marked_layers", "truncated"]

TEMPLATE_LAYERS = 4
"""The first layer, the interior one stamped, the one before the last, and the last."""
_MIN_DEPTH = TEMPLATE_LAYERS + 1  # at four layers or fewer, stamping saves nothing
# nn.Module's own bookkeeping, compared through the parameters, buffers and hooks instead
_MODULE_STATE = frozenset(vars(nn.Module())) - {"training"}
_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)


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
    if len(top) != 1 or not top[0][0] or global_module_hooks():
        return None
    prefix, layers = top[0]
    if len(layers) < _MIN_DEPTH or any(name != str(i) for i, name in enumerate(layers._modules)):
        return None
    template = layers[1]
    if not all(_alike(template, layer, 1, j) for j, layer in enumerate(layers)):
        return None
    return LayerStack(prefix, layers, len(layers))


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


@contextlib.contextmanager
def marked_layers(model: nn.Module) -> Iterator[None]:
    """Tag each forward node a layer makes with the layer's name
    (:func:`autoplan.core.graph.layer_of`) while ``model`` is traced, then remove the hooks.

    A layer is a child of an ``nn.ModuleList`` (a transformer's blocks), the unit
    activation checkpointing recomputes; a list nested in a layer belongs to it."""
    entered: list[contextlib.AbstractContextManager[None]] = []

    def enter(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            if entered:
                entered.append(contextlib.nullcontext())
            else:
                entered.append(fx_traceback.annotate({LAYER_KEY: name}))
            entered[-1].__enter__()

        return hook

    def leave(*_: Any) -> None:
        entered.pop().__exit__(None, None, None)

    layers = [
        (f"{prefix}.{child}" if prefix else child, layer)
        for prefix, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        for child, layer in module.named_children()
    ]
    handles = [h for name, layer in layers for h in _hooks(layer, enter(name), leave)]
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        while entered:  # a forward that raised inside a layer
            entered.pop().__exit__(None, None, None)
        for h in handles:
            h.remove()


def _hooks(module: nn.Module, before: Callable[..., None], after: Callable[..., None]) -> list[Any]:
    return [
        module.register_forward_pre_hook(before),
        module.register_forward_hook(after, always_call=True),
    ]
