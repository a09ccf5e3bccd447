"""Tying the variables of repeated identical layers."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.models.llama3 import Transformer, tiny


@pytest.mark.slow
@pytest.mark.parametrize("layers", [2, 4])
def test_tied_plan_matches_untied_on_tiny_llama(layers):
    """Tied and untied plans of a tiny LLaMA agree within 0.1 % (the price of tying)."""
    solver = "highs" if pytest.importorskip("highspy") else "cbc"
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = Transformer(tiny(layers))
    objectives = {}
    for tie in (True, False):
        plan = autoplan.plan(
            model,
            lambda: torch.randint(0, 128, (8, 32)),
            mesh,
            config=autoplan.PlanConfig(cluster_layers=tie, solver=solver),
            input_placements=["S(0)R"],
        )
        assert plan.status == "optimal"
        objectives[tie] = plan.objective_us
    assert objectives[True] == pytest.approx(objectives[False], rel=1e-3)
