"""Stage 1: the joint forward+backward trace."""

from __future__ import annotations

import time

import torch
from torch.distributed.tensor.debug import CommDebugMode

from autoplan.models.llama3 import Transformer, llama3_8b, tiny
from autoplan.trace import trace_joint


def test_trace_tiny_llama_has_every_gradient_with_its_shape():
    """Every parameter gets a gradient output of the parameter's shape; the loss is a scalar."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    tg = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    params = dict(model.named_parameters())
    assert set(tg.grads) == set(params)
    for fqn, node in tg.grads.items():
        assert tuple(tg.node(node).meta["val"].shape) == tuple(params[fqn].shape), fqn
    assert tuple(tg.node(tg.loss).meta["val"].shape) == ()
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
