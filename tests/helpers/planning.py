"""Planning the tiny MLP: a device slow enough for compute to matter, and one planning call."""

from __future__ import annotations

import torch

import autoplan
from autoplan.cost.topology import Device, Topology

# On H100s the tiny MLP's kernels sit at the per-kernel time floor, so computing replicated
# is free and beats any gradient reduction; on devices 10^5 times slower compute dominates.
SLOW_DEVICES = Topology(
    device=Device(
        "slow", peak_bf16_tflops=0.01, peak_fp32_tflops=0.01, hbm_gbps=10.0, memory_gib=80.0
    )
)


def plan_mlp(model: torch.nn.Module, mesh, **config) -> autoplan.Plan:
    """``model`` (the tiny MLP, as conftest's ``meta_mlp``) planned on ``mesh`` for a
    [16, 32, 64] batch split over the first axis; ``config`` is the PlanConfig's fields."""
    return autoplan.plan(
        model,
        lambda: torch.randn(16, 32, 64),
        mesh,
        config=autoplan.PlanConfig(**config),
        input_placements=["S(0)"],
    )
