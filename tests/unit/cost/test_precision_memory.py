"""Memory in bytes and mixed precision (FSDP2-style param_dtype / reduce_dtype)."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.cost.price import GRAD_SLOT, price
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint
from tests.helpers.planning import plan_mlp


def test_memory_matches_hand_arithmetic_fsdp_and_ddp(meta_mlp, mesh8):
    """Params + grads + 2 AdamW states, 4 bytes each: replicated = 16 B/elem, sharded 8-way = 2."""
    numel = sum(p.numel() for p in meta_mlp.parameters())
    ddp = plan_mlp(meta_mlp, mesh8)
    assert ddp.memory_bytes == numel * 4 * 4
    fsdp = plan_mlp(meta_mlp, mesh8, memory_budget_gib=numel * 4 * 4 / 8 / 2**30)
    assert all(p[0].is_shard() for p in fsdp.param_placements.values())
    assert fsdp.memory_bytes == numel * 4 * 4 / 8


def test_memory_matches_hand_arithmetic_tensor_parallel(meta_mlp):
    """Megatron-style TP on (dp=2, tp=4): w1 RS(0), w2 RS(1) hold a quarter each (16 B/elem / 4);
    w1 S(0)S(0) an eighth."""
    mesh = autoplan.fake_mesh((2, 4), ("dp", "tp"))
    pins = {
        "layers.0.w1.weight": "RS(0)",
        "layers.0.w2.weight": "RS(1)",
        "layers.1.w1.weight": "S(0)S(0)",
        "layers.1.w2.weight": "RR",
    }
    plan = autoplan.plan(
        meta_mlp, lambda: torch.randn(16, 32, 64), mesh, input_placements=["S(0)R"], pins=pins
    )
    numel = {n: p.numel() for n, p in meta_mlp.named_parameters()}
    shards = {"RS(0)": 4, "RS(1)": 4, "S(0)S(0)": 8, "RR": 1}
    assert plan.memory_bytes == sum(16 * numel[n] / shards[p] for n, p in pins.items())


def test_bf16_params_keep_fp32_masters_in_memory(meta_mlp, mesh8):
    """With param_dtype=bfloat16 the footprint still counts float32 masters, grads and states."""
    numel = sum(p.numel() for p in meta_mlp.parameters())
    plan = plan_mlp(meta_mlp, mesh8, param_dtype="bfloat16")
    assert plan.memory_bytes == numel * 4 * 4


def test_gathers_priced_in_param_dtype_reductions_in_reduce_dtype(meta_mlp, mesh8):
    """Parameters move at 2 bytes (bf16); their gradients are reduced at 4 bytes (fp32)."""
    traced = trace_joint(meta_mlp, lambda: torch.randn(16, 32, 64), param_dtype=torch.bfloat16)
    table = enumerate_strategies(traced, mesh8)
    costs = price(table, traced, autoplan.Topology(), master_bytes=4, reduce_bytes=4)
    params = set(traced.params)
    grad_edges = [e for e in costs.edges if e.slot == GRAD_SLOT]
    assert len(grad_edges) == len(params)
    assert all(e.tensor.dtype_bytes == 4 for e in grad_edges)
    param_edges = [e for e in costs.edges if e.src in params]
    assert param_edges and all(e.tensor.dtype_bytes == 2 for e in param_edges)


def test_bf16_compute_is_cheaper_than_fp32(mesh8):
    """Computing in bf16 uses the tensor-core peak: on a GEMM-bound MLP compute shrinks."""
    from autoplan.models.mlp import TinyMLP

    with torch.device("meta"):
        big = TinyMLP(dim=2048, hidden=8192, n_layers=1)

    batch_shape = (16, 1024, 2048)
    fp32 = plan_mlp(big, mesh8, batch_shape=batch_shape)
    bf16 = plan_mlp(big, mesh8, batch_shape=batch_shape, param_dtype="bfloat16")
    assert bf16.compute_us < 0.5 * fp32.compute_us


def test_bad_dtype_is_a_clear_error():
    """An unknown dtype names the field and the allowed values."""
    with pytest.raises(
        ValueError, match="param_dtype \\('bf16'\\) is not allowed; give one of \"bfloat16\""
    ):
        autoplan.PlanConfig(param_dtype="bf16")
