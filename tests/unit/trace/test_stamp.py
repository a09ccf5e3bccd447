"""A stamped trace is the full trace: same graph (fingerprint), names, layer tags and
traced fields; models whose layers are not alike are traced in full."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from autoplan.core.graph import fingerprint, layer_of
from autoplan.models import hf
from autoplan.models.llama3 import Transformer, tiny
from autoplan.models.mlp import TinyMLP
from autoplan.models.moe import MoETransformer, tiny_moe
from autoplan.trace.capture import TracedGraph, mean_loss, trace_joint
from autoplan.trace.layers import layer_stack, truncated

_FIELDS = ("param_fqns", "buffer_fqns", "params", "buffers", "inputs", "grads", "outputs")
_HF = {"num_hidden_layers": 5, "hidden_size": 64, "intermediate_size": 128}


def _tokens(vocab: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, vocab, (2, 16))


def _both(
    model: nn.Module, input_fn: Callable[[], Any], **kw: Any
) -> tuple[TracedGraph, TracedGraph]:
    return trace_joint(model, input_fn, **kw), trace_joint(
        model, input_fn, stamp_layers=False, **kw
    )


def _same(a: TracedGraph, b: TracedGraph) -> None:
    assert fingerprint(a.gm) == fingerprint(b.gm)
    na, nb = list(a.gm.graph.nodes), list(b.gm.graph.nodes)
    assert [n.name for n in na] == [n.name for n in nb]
    assert [layer_of(n) for n in na] == [layer_of(n) for n in nb]
    strides = [[tuple(v.stride()) for v in _vals(n)] for n in na]
    assert strides == [[tuple(v.stride()) for v in _vals(n)] for n in nb]
    for f in _FIELDS:
        assert getattr(a, f) == getattr(b, f), f
    assert a.tangents == b.tangents and a.frozen == b.frozen


def _vals(node: torch.fx.Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _llama(n_layers: int) -> nn.Module:
    with torch.device("meta"):
        return Transformer(tiny(n_layers=n_layers))


@pytest.mark.parametrize("n_layers", [5, 7])
@pytest.mark.parametrize("loss", [mean_loss, None])
def test_a_stamped_llama_is_its_full_trace(n_layers: int, loss: Any) -> None:
    stamped, full = _both(_llama(n_layers), _tokens(256), loss_fn=loss)
    assert stamped.stamped and not full.stamped
    _same(stamped, full)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_stamped_hugging_face_model_is_its_full_trace(kind: str) -> None:
    model = hf.build_hf(kind, _HF)
    stamped, full = _both(model, _tokens(model.config.vocab_size), loss_fn=mean_loss)
    assert stamped.stamped
    _same(stamped, full)


def test_a_stamped_moe_is_its_full_trace() -> None:
    with torch.device("meta"):
        moe = MoETransformer(tiny_moe(n_layers=5))
    stamped, full = _both(moe, _tokens(moe.args.vocab_size), loss_fn=mean_loss)
    assert stamped.stamped
    _same(stamped, full)


def test_ops_between_layers_fall_back_to_the_full_trace() -> None:
    # TinyMLP adds each block's output to its input in its own forward, between layers
    with torch.device("meta"):
        mlp = TinyMLP(dim=32, hidden=64, n_layers=5)
    assert layer_stack(mlp) is not None
    stamped, full = _both(mlp, lambda: torch.randn(8, 32), loss_fn=mean_loss)
    assert not stamped.stamped
    _same(stamped, full)


def test_param_dtype_and_frozen_layers_stamp_too() -> None:
    model = _llama(5)
    for p in model.layers[3].parameters():
        p.requires_grad_(False)
    assert layer_stack(model) is None  # a frozen layer is not alike the others
    model = _llama(5)
    for layer in model.layers:
        layer.attention.wq.weight.requires_grad_(False)
    stamped, full = _both(model, _tokens(256), loss_fn=mean_loss, param_dtype=torch.bfloat16)
    assert stamped.stamped and "layers.4.attention.wq.weight" in stamped.frozen
    _same(stamped, full)


class _Scaled(nn.Module):
    def __init__(self, dim: int, scale: float, index: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.scale, self.index = scale, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * torch.tanh(self.proj(x))


class _Stack(nn.Module):
    def __init__(self, scales: list[float], dims: list[int] | None = None) -> None:
        super().__init__()
        dims = dims or [16] * len(scales)
        self.inp = nn.Linear(16, 16)  # the first layer's input needs a gradient, as the others'
        self.layers = nn.ModuleList(
            _Scaled(d, s, i) for i, (d, s) in enumerate(zip(dims, scales, strict=True))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize(
    "model",
    [
        _Stack([1.0, 1.0, 1.0, 0.5, 1.0]),  # an attribute differs
        _Stack([1.0] * 5),  # alike: stamps
    ],
    ids=["attribute", "alike"],
)
def test_layers_that_differ_are_traced_in_full(model: nn.Module) -> None:
    stamped, full = _both(model, lambda: torch.randn(4, 16), loss_fn=mean_loss)
    alike = all(layer.scale == 1.0 for layer in model.layers)
    assert stamped.stamped == alike
    _same(stamped, full)


def test_a_layer_with_other_shapes_or_a_hook_is_not_alike() -> None:
    with torch.device("meta"):
        model = Transformer(tiny(n_layers=5))
        model.layers[4].feed_forward.w1 = nn.Linear(64, 96, bias=False)
    assert layer_stack(model) is None
    model = _llama(5)
    handle = model.layers[2].register_forward_hook(lambda *_: None)
    assert layer_stack(model) is None
    handle.remove()
    assert layer_stack(model) is not None
    handle = nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert layer_stack(model) is None  # a hook on every module runs in each layer too
    finally:
        handle.remove()
    assert layer_stack(model) is not None
    assert layer_stack(_llama(4)) is None  # four layers: nothing to stamp


class _Branching(nn.Module):
    """Layer 1 computes something else than layers 0 and 2: the template is irregular."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Scaled(16, 1.0, i) for i in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) * 2 if i == 1 else layer(x)
        return x


def test_an_irregular_template_falls_back_to_the_full_trace() -> None:
    stamped, full = _both(_Branching(), lambda: torch.randn(4, 16), loss_fn=mean_loss)
    assert not stamped.stamped
    _same(stamped, full)


def test_truncation_is_undone_even_when_the_trace_raises() -> None:
    model = _llama(5)
    stack = layer_stack(model)
    assert stack is not None
    with pytest.raises(RuntimeError), truncated(stack):
        assert len(model.layers) == 4
        raise RuntimeError
    assert len(model.layers) == 5
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in _llama(5).named_parameters()]
