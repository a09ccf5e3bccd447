"""The layer-by-layer mix of the tied LP's strategies (stage 5d, autoplan.ilp.untying.mix)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.bound.relax import relax
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.solver.stage import solve_ilp
from autoplan.ilp.untying.mix import lower_hull, mix_layers
from tests.helpers.brute_force import brute_force, footprint, step_time
from tests.helpers.ilp_problems import budget_between, layer_stack, tie_layers


def _weights_stack(num_layers: int) -> CostTable:
    """x -> (w_l -> mm_l) x layers -> out: each weight is big and fast (10 bytes, the mm
    pays 0) or small and slow (2 bytes, the mm pays 3); mm_l also reads mm_{l-1}."""
    ident = np.arange(2)
    compute, memory, edges = {"x": np.array([1.0, 2.0])}, {}, []
    prev = "x"
    for layer in range(num_layers):
        w, mm = f"w{layer}", f"mm{layer}"
        compute[w], compute[mm] = np.zeros(2), np.array([1.0, 1.5])
        memory[w] = np.array([10.0, 2.0])
        edges.append(EdgeCost(w, 0, mm, 0, ident, ident, np.array([[0.0, 0.0], [3.0, 3.0]])))
        edges.append(EdgeCost(prev, 0, mm, 1, ident, ident, np.array([[0.0, 1.0], [1.0, 0.0]])))
        prev = mm
    compute["out"] = np.array([1.0, 1.0])
    edges.append(EdgeCost(prev, 0, "out", 0, ident, ident, np.zeros((2, 2))))
    return CostTable(compute=compute, edges=tuple(edges), memory=memory)


def test_mix_takes_the_fast_weight_in_as_many_layers_as_the_budget_holds():
    """Six layers, room for four big weights: the LP splits every weight 4/6 : 2/6, the mix
    takes the big one in four layers and the small one in two, the brute-force optimum."""
    costs = _weights_stack(6)
    budget = 4 * 10.0 + 2 * 2.0
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    relaxed = relax(model)
    assert relaxed.lp_values["w0"][0] == pytest.approx(4 / 6)
    choice, cost = mix_layers(costs, model, relaxed)
    assert sorted(choice[f"w{k}"] for k in range(6)) == [0, 0, 0, 0, 1, 1]
    assert cost == pytest.approx(step_time(costs, choice))
    assert cost == pytest.approx(brute_force(costs, budget=budget))
    assert cost < relaxed.upper  # no tied plan mixes: it pays for the small weight six times


def test_untie_stage_returns_the_mix_when_it_is_near_the_bound():
    """solve_ilp on the same stack: the optimum, with the layers split."""
    costs = _weights_stack(6)
    budget = 4 * 10.0 + 2 * 2.0
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    solution, split = solve_ilp(costs, model)
    assert solution.objective_us == pytest.approx(brute_force(costs, budget=budget))
    assert split > 0


@pytest.mark.parametrize("coupled", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_mix_fits_the_budget_and_costs_what_it_says(seed, coupled):
    """Random stacks: when there is a mix, it meets the budget, is priced exactly and is no
    cheaper than the brute-force optimum."""
    costs = layer_stack(3, seed, coupled=coupled)
    budget = budget_between(costs, 0.3 + 0.2 * (seed % 3))
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    found = mix_layers(costs, model, relax(model))
    assert found is not None
    choice, cost = found
    assert footprint(costs, choice) <= budget
    assert cost == pytest.approx(step_time(costs, choice))
    assert cost >= brute_force(costs, budget=budget) - 1e-9


def test_no_mix_without_a_budget():
    """With no budget there is no knapsack to mix over."""
    costs = _weights_stack(3)
    model = build_ilp(costs, tie=tie_layers(costs))
    assert mix_layers(costs, model, relax(model)) is None


def test_hull_keeps_the_options_that_save_time_at_a_falling_rate_per_byte():
    """(memory, time): (1, 10) -> (2, 6) -> (4, 4) save 4 then 1 per byte; (3, 5.5) lies
    above the segment (2, 6)-(4, 4) and (5, 4) is no faster: both are left out."""
    options = [
        (4.0, 4.0, (2,)),
        (1.0, 10.0, (0,)),
        (3.0, 5.5, (3,)),
        (2.0, 6.0, (1,)),
        (5.0, 4.0, (4,)),
    ]
    assert [o[2] for o in lower_hull(options)] == [(0,), (1,), (2,)]
