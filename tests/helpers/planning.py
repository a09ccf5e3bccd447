"""Planning the tiny models: a device slow enough for compute to matter, one call per model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import autoplan
from autoplan.core.topology import Device, Topology
from autoplan.models.llama3 import Transformer, tiny

# On H100s the tiny MLP's kernels sit at the per-kernel time floor, so computing replicated
# is free and beats any gradient reduction; on devices 10^5 times slower compute dominates.
SLOW_DEVICES = Topology(
    device=Device(
        "slow", peak_bf16_tflops=0.01, peak_fp32_tflops=0.01, hbm_gbps=10.0, memory_gib=80.0
    )
)


def plan_model(
    build: Callable[[], torch.nn.Module],
    input_fn: Callable[[], Any],
    mesh,
    *,
    input_placements=None,
    output_placements=None,
    pins=None,
    loss_fn=None,
    broadcast_from: int | None = None,
    **config,
) -> autoplan.Plan:
    """``build()``, made on the meta device, planned on ``mesh`` for ``input_fn``'s batch;
    ``config`` is the PlanConfig's fields, the other options go to autoplan.plan as given."""
    with torch.device("meta"):
        model = build()
    return autoplan.plan(
        model,
        input_fn,
        mesh,
        config=autoplan.PlanConfig(**config),
        input_placements=input_placements,
        output_placements=output_placements,
        pins=pins,
        loss_fn=loss_fn,
        broadcast_from=broadcast_from,
    )


def plan_mlp(
    model: torch.nn.Module, mesh, *, batch_shape: tuple[int, ...] = (16, 32, 64), **config
) -> autoplan.Plan:
    """``model`` (an MLP, as conftest's ``meta_mlp``) planned on ``mesh`` for a random batch
    of ``batch_shape`` split over the first axis; ``config`` is the PlanConfig's fields."""
    return plan_model(
        lambda: model,
        lambda: torch.randn(*batch_shape),
        mesh,
        input_placements=["S(0)"],
        **config,
    )


def plan_tiny_llama(
    mesh,
    *,
    input_placements,
    config: autoplan.PlanConfig,
    num_layers: int = 2,
    batch: int = 8,
    seq: int = 16,
    **kwargs,
) -> autoplan.Plan:
    """A tiny LLaMA (``tiny(num_layers)``, vocabulary 128) built on the meta device and
    planned on ``mesh`` for a [batch, seq] batch of token ids; ``kwargs`` go to autoplan.result.plan."""
    with torch.device("meta"):
        model = Transformer(tiny(num_layers))
    return autoplan.plan(
        model,
        lambda: torch.randint(0, 128, (batch, seq)),
        mesh,
        input_placements=input_placements,
        config=config,
        **kwargs,
    )


def plan_pinned_llama(pins=None, **kw):
    """The tiny LLaMA (batch 8, seq 16) planned with HiGHS on a 2 x 2 (dp, tp) mesh under ``pins``."""
    return plan_tiny_llama(
        autoplan.fake_mesh((2, 2), ("dp", "tp")),
        batch=8,
        seq=16,
        input_placements=["S(0)R"],
        pins=pins,
        config=autoplan.PlanConfig(solver="highs"),  # CBC: 4-20 s on these, HiGHS ~4 s
        **kw,
    )
