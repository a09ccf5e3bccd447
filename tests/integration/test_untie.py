"""Untying repeated layers under a memory budget (stage 5d), run by solve_ilp."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.cost.price import CostTable
from autoplan.ilp.bound.relax import relax
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.solver.solve import solve
from autoplan.ilp.solver.stage import solve_ilp
from autoplan.ilp.untying.untie import worth_untying
from autoplan.models.mlp import TinyMLP
from tests.helpers.brute_force import brute_force, footprint, step_time
from tests.helpers.ilp_problems import (
    budget_between,
    layer_stack,
    tie_layers,
)


def _tied_then_untied(costs: CostTable, budget: float):
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    assert worth_untying(model, relax(model))
    return solve(model), solve_ilp(costs, model)


@pytest.mark.parametrize("seed", range(20))
def test_untying_reaches_the_optimum_when_only_the_budget_couples_the_layers(seed):
    """Layers that differ only through the budget: the untied plan is the brute-force optimum."""
    costs = layer_stack(3, seed, coupled=False)
    budget = budget_between(costs, 0.3 + 0.2 * (seed % 3))
    tied, (untied, split) = _tied_then_untied(costs, budget)
    assert untied.objective_us == pytest.approx(brute_force(costs, budget=budget))
    assert (split > 0) == (untied.objective_us < tied.objective_us)


@pytest.mark.parametrize("seed", range(20))
def test_untied_plan_fits_is_priced_exactly_and_is_never_dearer(seed):
    """Coupled layers: the untied plan meets the budget, costs what it says, and beats or ties the tied one."""
    costs = layer_stack(3, seed, coupled=True)
    budget = budget_between(costs, 0.3 + 0.2 * (seed % 3))
    tied, (untied, _) = _tied_then_untied(costs, budget)
    assert footprint(costs, untied.choice) <= budget
    assert untied.objective_us == pytest.approx(step_time(costs, untied.choice))
    assert brute_force(costs, budget=budget) - 1e-9 <= untied.objective_us <= tied.objective_us


def test_planner_unties_a_budgeted_mlp_stack_to_the_untied_optimum():
    """Six identical MLP blocks under a binding budget: tied + untie matches the ILP with no ties."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = TinyMLP(dim=64, hidden=256, n_layers=6)
    plans = {}
    for cluster_layers, untie in ((True, True), (True, False), (False, False)):
        config = autoplan.PlanConfig(
            memory_budget_gib=1.5 * 2**20 / 2**30,  # half the free plan's 3 MiB
            cluster_layers=cluster_layers,
            untie_under_budget=untie,
        )
        plans[cluster_layers, untie] = autoplan.plan(
            model, lambda: torch.randn(32, 64), mesh, config=config
        )
    untied, tied_only, plain = plans[True, True], plans[True, False], plans[False, False]
    assert untied.status == tied_only.status == plain.status == "optimal"
    assert untied.ilp_size["untied"] > 0 and "split under the memory budget" in untied.summary()
    assert untied.memory_bytes <= 1.5 * 2**20
    assert tied_only.objective_us > plain.objective_us * 1.01
    assert untied.objective_us == pytest.approx(plain.objective_us, rel=1e-6)
