"""Frozen parameters (``requires_grad=False``): planned and priced like any other parameter
in the forward, with no gradient, no gradient collective and no optimizer state. Their
training on 4 gloo processes against one device is in tests/integration/test_frozen.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoplan
from autoplan.core.placements import fmt
from autoplan.cost.price import GRAD_SLOT, price
from autoplan.result.plan import Plan
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint
from tests.helpers.frozen_models import AXES, MESH, MODELS, PINS, WORLD, Adapted
from tests.helpers.planning import plan_model


def _issue_model() -> nn.Sequential:
    """The issue's example: the first layer's weight frozen."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    model[0].weight.requires_grad_(False)
    return model


@pytest.mark.parametrize("mm_mode", ["einsum", "native"])
def test_frozen_weight_is_planned_in_both_mm_modes(mm_mode):
    """The issue's model plans in either mm mode and its frozen weight gets a placement."""
    plan = autoplan.plan(
        _issue_model(),
        lambda: torch.randn(8, 16),
        autoplan.fake_mesh(MESH, AXES),
        config=autoplan.PlanConfig(mm_mode=mm_mode),
    )
    assert plan.status == "optimal"
    assert set(plan.param_placements) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert len(plan.param_placements["0.weight"]) == len(MESH)


@pytest.mark.parametrize("mm_mode", ["einsum", "native"])
def test_frozen_weight_counts_no_gradient_or_optimizer_state(mm_mode):
    """Freezing a weight placed S(0)S(0) saves its gradient and two AdamW states per device
    and nothing else: 3 x (32 x 16 / 4) float32 elements."""
    pins = {"0.weight": "S(0)S(0)", "0.bias": "RR", "2.weight": "RR", "2.bias": "RR"}

    def planned(model: nn.Module) -> Plan:
        return autoplan.plan(
            model,
            lambda: torch.randn(8, 16),
            autoplan.fake_mesh(MESH, AXES),
            config=autoplan.PlanConfig(mm_mode=mm_mode, optimizer_states=2),
            pins=pins,
        )

    trainable = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    frozen, shard = planned(_issue_model()), 32 * 16 // WORLD * 4
    trained = planned(trainable)
    assert frozen.memory_bytes == trained.memory_bytes - 3 * shard
    saved = {
        k: trained.memory_breakdown[k] - frozen.memory_breakdown[k]
        for k in ("parameters", "gradients", "optimizer")
    }
    assert saved == {"parameters": 0, "gradients": shard, "optimizer": 2 * shard}


def test_frozen_parameters_have_no_gradient_and_no_gradient_move():
    """A module frozen whole and a frozen weight beside trainable layers: the graph gives
    them no gradient and the cost model no gradient edge (no reduction to price or run),
    while the plan places them."""
    traced, _ = rewrite(trace_joint(Adapted(), MODELS["adapted"][1]), mm_mode="einsum")
    assert traced.frozen == ("inp.weight", "mid.weight", "mid.bias")
    assert set(traced.grads) == {"inp.bias", "out.weight", "out.bias"}
    table = enumerate_strategies(traced, autoplan.fake_mesh(MESH, AXES), mm_mode="einsum")
    costs = price(table, traced, autoplan.Topology())
    node = dict(zip(traced.param_fqns, traced.params, strict=True))
    assert {e.dst for e in costs.edges if e.slot == GRAD_SLOT} == {
        node[f] for f in ("inp.bias", "out.weight", "out.bias")
    }
    plan = plan_model(
        *MODELS["adapted"],
        autoplan.fake_mesh(MESH, AXES),
        input_placements="S(0)R",
        pins=PINS["adapted"],
        mm_mode="einsum",
    )
    assert set(plan.param_placements) == set(traced.param_fqns)
    assert fmt(plan.param_placements["inp.weight"]) == "S(0)S(1)"


def test_no_trainable_parameter_is_a_plan_error():
    """A model with every parameter frozen is a PlanError naming the count and the fix."""
    model = _issue_model().requires_grad_(False)
    with pytest.raises(
        autoplan.PlanError,
        match=r"Sequential has no trainable parameters.*its 4 parameters.*requires_grad_\(True\)",
    ):
        autoplan.plan(model, lambda: torch.randn(8, 16), autoplan.fake_mesh(MESH, AXES))
