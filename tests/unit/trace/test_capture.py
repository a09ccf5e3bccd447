"""Stage 1: the joint forward+backward trace."""

from __future__ import annotations

import gc
import time

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.core.torch_adapter import force_eager_graph_module
from autoplan.models.llama3 import Transformer, llama3_8b, tiny
from autoplan.trace.capture import trace_joint


def test_trace_tiny_llama_has_every_gradient_with_its_shape():
    """Every parameter gets a gradient output of the parameter's shape; the logits are the
    one output and their cotangent a placeholder of their shape."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    tg = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    params = dict(model.named_parameters())
    assert set(tg.grads) == set(params)
    for fqn, node in tg.grads.items():
        assert tuple(tg.node(node).meta["val"].shape) == tuple(params[fqn].shape), fqn
    (logits,) = tg.outputs
    assert tuple(tg.node(logits).meta["val"].shape) == (2, 16, 128)
    assert tuple(tg.node(tg.tangents[0]).meta["val"].shape) == (2, 16, 128)
    assert len(tg.params) == len(params) and len(tg.inputs) == 1


def test_trace_under_comm_debug_mode_is_the_same_graph():
    """A caller's CommDebugMode (dispatch mode + module hooks) must not change the graph.

    Tracing under its module tracker once added backward-hook ``detach`` nodes, so a
    plan no longer matched the graph ``parallelize`` traced inside a user's debug mode.
    """
    with torch.device("meta"):
        model = Transformer(tiny(1))

    def ops(tg) -> list[str]:
        return [f"{n.name}:{n.target}" for n in tg.gm.graph.nodes]

    plain = ops(trace_joint(model, lambda: torch.randint(0, 128, (2, 16))))
    with CommDebugMode():
        debugged = ops(trace_joint(model, lambda: torch.randint(0, 128, (2, 16))))
    assert debugged == plain


def test_trace_under_a_callers_math_sdpa_backend_is_the_same_graph():
    """A caller's ``sdpa_kernel(SDPBackend.MATH)`` must not turn attention into its math decomposition."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.device("meta"):
        model = Transformer(tiny(1))

    def ops(tg) -> list[str]:
        return [f"{n.name}:{n.target}" for n in tg.gm.graph.nodes]

    plain = ops(trace_joint(model, lambda: torch.randint(0, 128, (2, 16))))
    with sdpa_kernel(SDPBackend.MATH):
        math_only = ops(trace_joint(model, lambda: torch.randint(0, 128, (2, 16))))
        assert not torch.backends.cuda.flash_sdp_enabled()  # the caller's choice is restored
    assert math_only == plain
    assert any("_scaled_dot_product_flash_attention_for_cpu.default" in op for op in math_only)


def test_trace_every_node_carries_tensor_metadata():
    """Shape, dtype and stride are on every tensor node (the later stages read them)."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    tg = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    for n in tg.gm.graph.nodes:
        if n.op in ("placeholder", "call_function"):
            assert "val" in n.meta, n.name


def test_trace_uses_cpu_flash_attention_kernel():
    """Attention is traced as the fused kernel (shardable on batch and heads), not the math path."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    tg = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    targets = {str(n.target) for n in tg.gm.graph.nodes}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in targets
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in targets


def test_trace_8b_layer_on_meta_allocates_nothing_and_is_fast():
    """One LLaMA3-8B layer traces on fake tensors in seconds (no 8B-sized allocation)."""
    with torch.device("meta"):
        model = Transformer(llama3_8b(1))
    start = time.perf_counter()
    tg = trace_joint(model, lambda: torch.randint(0, 128256, (16, 8192)))
    assert time.perf_counter() - start < 30
    assert all(p.is_meta for p in model.parameters())
    assert tg.num_nodes > 100


def _fake_signature(val: object) -> object:
    if isinstance(val, torch.Tensor):
        return tuple(val.shape), val.dtype, val.stride()
    if isinstance(val, (tuple, list)):
        return tuple(_fake_signature(v) for v in val)
    return val


def _node_signature(node: torch.fx.Node) -> tuple:
    fake = _fake_signature(node.meta.get("val"))
    return (node.name, node.op, str(node.target), str(node.args), str(node.kwargs), fake)


def test_lazy_codegen_trace_is_the_eager_trace():
    """The lazily compiled GraphModule has the eager one's nodes, fake values, tensor_meta and code."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    lazy = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    with force_eager_graph_module():
        eager = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    assert "_code" not in lazy.gm.__dict__ and "_code" in eager.gm.__dict__
    assert str(lazy.gm.graph) == str(eager.gm.graph)
    lazy_nodes, eager_nodes = list(lazy.gm.graph.nodes), list(eager.gm.graph.nodes)
    assert [_node_signature(n) for n in lazy_nodes] == [_node_signature(n) for n in eager_nodes]
    assert [n.meta.keys() for n in lazy_nodes] == [n.meta.keys() for n in eager_nodes]
    assert all(
        a.meta.get("tensor_meta") == b.meta.get("tensor_meta")
        for a, b in zip(lazy_nodes, eager_nodes, strict=True)
    )
    assert (lazy.params, lazy.buffers, lazy.inputs, lazy.grads, lazy.outputs) == (
        eager.params,
        eager.buffers,
        eager.inputs,
        eager.grads,
        eager.outputs,
    )
    assert lazy.gm.code == eager.gm.code  # generated on first use


def test_trace_restores_lazy_graph_module_flag_and_gc():
    """Tracing leaves neither torch's lazy-GraphModule flag on nor the caller's GC state changed."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    assert gc.isenabled()
    assert "_code" in make_fx(lambda x: x + 1)(torch.ones(2)).__dict__
    gc.disable()
    try:
        trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Mixed(torch.nn.Module):
    """Outputs of every kind: a dict with a non-differentiable tensor, a plain int and a
    nested tuple of two differentiable tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict:
        h = self.a(x)
        return {"h": h, "mask": mask, "n": 3, "y": (self.b(h).relu(), h.sum())}


def test_the_joint_graph_computes_the_model_and_its_gradients_from_flat_inputs():
    """The traced module takes parameters, buffers, inputs and one cotangent per
    differentiable output, in that order, and returns what eager autograd gives."""
    torch.manual_seed(0)
    model = _Mixed()
    x, mask = torch.randn(2, 8), torch.ones(2, 8, dtype=torch.bool)
    tg = trace_joint(model, lambda: (torch.randn(2, 8), torch.ones(2, 8, dtype=torch.bool)))
    placeholders = [n.name for n in tg.gm.graph.nodes if n.op == "placeholder"]
    assert placeholders == [*tg.params, *tg.buffers, *tg.inputs, *tg.tangents.values()]
    assert sorted(tg.tangents) == [0, 2, 3]  # h, relu(b(h)), h.sum(); not the mask
    out = model(x, mask)
    tensors = [out["h"], out["mask"], *out["y"]]
    cotangents = [torch.randn_like(tensors[i]) for i in sorted(tg.tangents)]
    params = [p for _, p in model.named_parameters()]
    got = tg.gm(*params, x, mask, *cotangents)
    diff = [tensors[i] for i in sorted(tg.tangents)]
    want = torch.autograd.grad(diff, params, cotangents)
    assert tg.unflatten(got[: len(tensors)])["n"] == 3
    for a, b in zip(got[: len(tensors)], tensors, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(got[len(tensors) :], want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_model_whose_output_needs_no_parameter_is_refused_by_name():
    model = _Mixed()
    with pytest.raises(ValueError, match="no output of _Mixed depends on a trainable parameter"):
        trace_joint(
            model,
            lambda: (torch.randn(2, 8), torch.ones(2, 8, dtype=torch.bool)),
            loss_fn=lambda out: out["mask"].float().sum(),
        )
