"""activation_checkpointing="auto": each layer's mode as part of its strategies
(autoplan.memory.layer_modes), priced exactly, chosen per layer by the ILP."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.core.config import CHECKPOINT_MODES
from tests.helpers.planning import plan_tiny_llama


def _plan(budget: float, mode: str) -> autoplan.Plan:
    return plan_tiny_llama(
        autoplan.fake_mesh((4,), ("dp",)),
        num_layers=4,
        batch=8,
        seq=32,
        input_placements=["S(0)"],
        config=autoplan.PlanConfig(
            memory_budget_gib=budget, activation_checkpointing=mode, activation_memory=True
        ),
    )


@pytest.mark.slow  # four plans under a binding budget: about two minutes
def test_auto_mixes_modes_across_layers_when_that_is_cheaper():
    """Under a budget no uniform mode meets cheaply, auto recomputes some layers in full
    and keeps the others, within the budget (the backward's transient included), and
    beats every mode taken for all layers."""
    budget = 0.004
    auto = _plan(budget, "auto")
    assert auto.status == "optimal"
    assert {"none", "full"} <= set(auto.checkpointing.values()), auto.checkpointing
    assert auto.memory_bytes + auto.memory_breakdown["transient"] <= budget * 2**30
    for mode in CHECKPOINT_MODES:
        uniform = _plan(budget, mode)
        peak = uniform.memory_bytes + uniform.memory_breakdown.get("transient", 0.0)
        if uniform.status != "infeasible" and peak <= budget * 2**30:  # a plan that fits
            assert auto.objective_us < uniform.objective_us, mode
    full = [n for n in auto.recompute if auto.node_placements[n]["op"] == "aten.einsum.default"]
    assert full  # a full layer's matmuls run again
