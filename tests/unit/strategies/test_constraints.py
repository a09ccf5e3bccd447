"""Pinned placements: the plan keeps them, twins stay free, mistakes are named."""

from __future__ import annotations

import pytest

from autoplan.core.placements import fmt
from tests.helpers.planning import plan_pinned_llama

WQ0, WQ1 = "layers.0.attention.wq.weight", "layers.1.attention.wq.weight"


NODE, NODE_PIN = "einsum_default", "S(1)S(2)"  # layer 0's wq einsum: sequence on dp, heads on tp


@pytest.fixture(scope="module")
def free_plan():
    return plan_pinned_llama()


@pytest.fixture(scope="module")
def pinned_plan():
    return plan_pinned_llama({WQ0: "S(0)S(0)", "output.weight": "S(0)R", NODE: NODE_PIN})


def test_pinned_parameters_get_their_placement_and_cost_no_less(free_plan, pinned_plan):
    """The free plan replicates every weight; the pins hold and the step is no cheaper."""
    assert free_plan.status == pinned_plan.status == "optimal"
    assert fmt(free_plan.param_placements[WQ0]) == "RR"
    assert fmt(pinned_plan.param_placements[WQ0]) == "S(0)S(0)"
    assert fmt(pinned_plan.param_placements["output.weight"]) == "S(0)R"
    assert pinned_plan.objective_us >= free_plan.objective_us - 1e-6


def test_a_pin_does_not_spread_to_the_twin_layer(pinned_plan):
    """Layers 0 and 1 are tied twins; pinning layer 0's wq leaves layer 1's at its optimum."""
    assert fmt(pinned_plan.param_placements[WQ1]) == "RR"


def test_a_graph_node_can_be_pinned(free_plan, pinned_plan):
    """A node name pins that node's output placement."""
    assert free_plan.node_placements[NODE]["out"][0] != NODE_PIN
    assert pinned_plan.node_placements[NODE]["out"][0] == NODE_PIN
