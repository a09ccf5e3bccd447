"""Untying repeated layers under a memory budget (stage 5d), run by solve_ilp."""

from __future__ import annotations

import pytest
import torch

import autoplan
import autoplan.ilp.solver.solve as solve_module
import autoplan.ilp.solver.stage as stage_module
import autoplan.ilp.untying.untie as untie_module
from autoplan.ilp.backends import RunResult
from autoplan.ilp.bound.relax import relax
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.solver.solve import node_limit, solve
from autoplan.ilp.solver.stage import PROOF_NODES, PROOF_WORK, solve_ilp
from autoplan.ilp.untying.untie import worth_untying
from autoplan.models.mlp import TinyMLP
from tests.helpers.brute_force import brute_force, combos, footprint, step_time
from tests.helpers.ilp_problems import (
    FEASIBLE_MEMORY_SEEDS,
    budget_between,
    layer_stack,
    random_costs,
    tie_layers,
)


def test_nothing_to_untie_without_a_budget():
    """With no budget the tied plan stands: no LP mix to split."""
    costs = layer_stack(3, 0, coupled=False)
    model = build_ilp(costs, tie=tie_layers(costs))
    assert not worth_untying(model, relax(model))


def test_nothing_to_untie_when_the_budget_does_not_bind():
    """A budget above every plan's footprint leaves the LP's memory row slack: no untying."""
    costs = layer_stack(3, 0, coupled=False)
    model = build_ilp(costs, memory_budget_bytes=budget_between(costs, 1.5), tie=tie_layers(costs))
    assert not worth_untying(model, relax(model))


@pytest.mark.parametrize("solver", ["cbc", "highs"])
@pytest.mark.parametrize("seed", FEASIBLE_MEMORY_SEEDS)
def test_cutoff_keeps_every_plan_cheaper_than_it(seed, solver):
    """A cutoff above the optimum still finds it (with more columns fixed); one below it
    returns a valid plan no cheaper than the optimum, still proved optimal, and the
    cutoff is then a bound."""
    costs = random_costs(seed, memory=True)
    footprints = sorted({footprint(costs, c) for c in combos(costs)})
    budget = footprints[len(footprints) // 2]
    best = brute_force(costs, budget=budget)
    model = build_ilp(costs, memory_budget_bytes=budget)
    plain = solve(model, solver=solver)
    above = solve(model, solver=solver, cutoff=best * 1.001 + 1e-3)
    assert above.status == "optimal" and above.objective_us == pytest.approx(best)
    assert above.stats.get("fixed", 0) >= plain.stats.get("fixed", 0)
    below = solve(model, solver=solver, cutoff=best * 0.9999)
    assert below.status == "optimal" and below.objective_us >= best - 1e-9
    if model.emitted.matrix.num_cols:  # else solved outright, with no MIP and no bound
        assert below.bound_us >= best * 0.9999 - 1e-6
    assert step_time(costs, below.choice) == pytest.approx(below.objective_us)
    assert footprint(costs, below.choice) <= budget


def _cut_proofs(monkeypatch, stopped_by: str = "nodes") -> list[int | None]:
    """Make the tied proof's MIP stop with no plan, on its node limit (as CBC does when
    the proof after untying runs out of nodes) or on time; returns the node limits those
    runs were given."""
    real, limits = solve_module.run, []

    def cut(m, solver, **kwargs):
        if kwargs["mip"] and kwargs.get("cutoff") is not None:
            limits.append(kwargs.get("max_nodes"))
            return RunResult("stopped", None, stopped_by=stopped_by)
        return real(m, solver, **kwargs)

    monkeypatch.setattr(solve_module, "run", cut)
    return limits


def test_a_cut_tied_proof_keeps_the_untied_plan_with_status_node_limit(monkeypatch):
    """The tied MIP after untying gets a node limit of its own; cut there, the untied plan says node_limit and its gap."""
    costs = layer_stack(3, 0, coupled=False)
    budget = budget_between(costs, 0.3)
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    whole, split = solve_ilp(costs, model)
    assert whole.status == "optimal" and whole.proof_nodes is None and split > 0
    limits = _cut_proofs(monkeypatch)
    cut, split_cut = solve_ilp(costs, model)
    assert limits == [PROOF_NODES]
    assert cut.status == "node_limit" and cut.proof_nodes == PROOF_NODES
    assert (cut.objective_us, cut.choice, split_cut) == (whole.objective_us, whole.choice, split)
    assert 0.0 <= cut.gap < 1.0


def test_node_limits_shrink_with_the_mip_and_keep_a_floor():
    """A node limit holds for a small MIP; a large one gets fewer nodes, never under the
    floor, and one past its work at the floor is not run (0)."""
    assert node_limit(None, 10**6, PROOF_WORK) is None
    assert node_limit(PROOF_NODES, 10**9) == PROOF_NODES  # no work given: the count alone
    assert node_limit(PROOF_NODES, 100, PROOF_WORK) == PROOF_NODES
    large = node_limit(PROOF_NODES, 100_000, PROOF_WORK)
    assert large is not None and large < PROOF_NODES
    assert large == node_limit(PROOF_NODES, 100_000, PROOF_WORK)  # no clock, no state
    at_floor = PROOF_WORK // solve_module._MIN_NODES
    assert node_limit(PROOF_NODES, at_floor, PROOF_WORK) == solve_module._MIN_NODES
    assert node_limit(PROOF_NODES, at_floor + 1, PROOF_WORK) == 0  # past it at the floor
    assert node_limit(3, at_floor, PROOF_WORK) == 3  # a limit below the floor stays as given
    assert node_limit(3, 10**9, PROOF_WORK) == 0


def test_a_cut_proof_names_the_limit_its_size_got(monkeypatch):
    """The tied proof of a MIP too large for PROOF_NODES gets the scaled limit, and the
    plan's gap and proof_nodes say that limit."""
    costs = layer_stack(3, 0, coupled=False)
    budget = budget_between(costs, 0.3)
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    monkeypatch.setattr(stage_module, "PROOF_WORK", 50)
    monkeypatch.setattr(solve_module, "_MIN_NODES", 2)
    limits = _cut_proofs(monkeypatch)
    cut, _ = solve_ilp(costs, model)
    assert len(limits) == 1 and limits[0] is not None and 2 <= limits[0] < PROOF_NODES
    assert cut.status == "node_limit" and cut.proof_nodes == limits[0]


def test_untie_passes_get_fewer_nodes_on_a_larger_mip(monkeypatch):
    """Each untie pass's MIP gets PASS_NODES, or fewer when its columns times them pass
    the pass's work; the plan stays valid and within the budget."""
    costs = layer_stack(3, 0, coupled=True)
    budget = budget_between(costs, 0.2)
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    real, passes = solve_module.run, []

    def spy(m, solver, **kwargs):
        if kwargs["mip"] and kwargs.get("cutoff") is None:
            passes.append((m.num_cols, kwargs.get("max_nodes")))
        return real(m, solver, **kwargs)

    monkeypatch.setattr(solve_module, "run", spy)
    whole, _ = solve_ilp(costs, model)
    assert passes and all(n == untie_module._PASS_NODES for _, n in passes)
    passes.clear()
    monkeypatch.setattr(untie_module, "_PASS_WORK", 40)
    monkeypatch.setattr(solve_module, "_MIN_NODES", 1)
    cut, _ = solve_ilp(costs, model)
    assert passes and all(n == max(1, 40 // cols) for cols, n in passes)
    assert footprint(costs, cut.choice) <= budget
    assert step_time(costs, cut.choice) == pytest.approx(cut.objective_us)


def test_a_proof_past_its_work_is_not_run_and_the_plan_says_so(monkeypatch):
    """A tied proof whose floor of nodes is past its work is not run: the untied plan
    comes back as node_limit, proof_nodes 0, its gap to the tied bound, no MIP called."""
    costs = layer_stack(3, 0, coupled=False)
    budget = budget_between(costs, 0.3)
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    whole, split = solve_ilp(costs, model)
    real, proofs = solve_module.run, []

    def spy(m, solver, **kwargs):
        if kwargs["mip"] and kwargs.get("cutoff") is not None:
            proofs.append(m.num_cols)
        return real(m, solver, **kwargs)

    monkeypatch.setattr(solve_module, "run", spy)
    monkeypatch.setattr(stage_module, "PROOF_WORK", 1)
    skipped, split_skipped = solve_ilp(costs, model)
    assert proofs == []
    assert skipped.status == "node_limit" and skipped.proof_nodes == 0
    assert skipped.stats["skipped_columns"] > 0
    assert (skipped.objective_us, skipped.choice, split_skipped) == (
        whole.objective_us,
        whole.choice,
        split,
    )
    assert 0.0 <= skipped.gap < 1.0


def test_planner_says_a_proof_was_not_run(monkeypatch):
    """A plan whose tied proof was too large to run says so and names its columns."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = TinyMLP(dim=64, hidden=256, n_layers=6)
    config = autoplan.PlanConfig(memory_budget_gib=1.5 * 2**20 / 2**30)
    monkeypatch.setattr(stage_module, "PROOF_WORK", 1)
    plan = autoplan.plan(model, lambda: torch.randn(32, 64), mesh, config=config)
    assert plan.status == "node_limit" and plan.ilp_size["untied"] > 0
    assert "over tied plans was not run: at " in plan.message
    assert "columns even its first nodes are past the proof's limit of work" in plan.message
    assert "limit of 0 branch-and-bound" not in plan.message


def test_a_tied_proof_cut_by_the_clock_says_time_limit(monkeypatch):
    """The user's time limit stopping the tied proof gives time_limit, not node_limit."""
    costs = layer_stack(3, 0, coupled=False)
    budget = budget_between(costs, 0.3)
    model = build_ilp(costs, memory_budget_bytes=budget, tie=tie_layers(costs))
    _cut_proofs(monkeypatch, stopped_by="time")
    short, _ = solve_ilp(costs, model, time_limit_s=2.0)
    assert short.status == "time_limit" and short.proof_nodes is None


def test_planner_says_which_limit_cut_the_tied_proof(monkeypatch):
    """A plan whose tied proof was cut names its node limit and the gap, not time_limit_s."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = TinyMLP(dim=64, hidden=256, n_layers=6)
    config = autoplan.PlanConfig(memory_budget_gib=1.5 * 2**20 / 2**30)
    _cut_proofs(monkeypatch)
    plan = autoplan.plan(model, lambda: torch.randn(32, 64), mesh, config=config)
    assert plan.status == "node_limit" and plan.ilp_size["untied"] > 0
    assert f"stopped at its limit of {PROOF_NODES} branch-and-bound nodes" in plan.message
    assert "untie_under_budget: false" in plan.message and "time_limit_s (" not in plan.message


def test_an_untied_optimal_plan_says_what_was_proved():
    """Untied under a budget and proved: "optimal among tied plans", naming the split classes."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = TinyMLP(dim=64, hidden=256, n_layers=6)
    config = autoplan.PlanConfig(memory_budget_gib=1.5 * 2**20 / 2**30)
    plan = autoplan.plan(model, lambda: torch.randn(32, 64), mesh, config=config)
    split = plan.ilp_size["untied"]
    assert plan.status == "optimal" and split > 0
    assert plan.message.startswith("optimal among tied plans: ")
    assert f"{split} twin class" in plan.message and "untie_under_budget: false" in plan.message
    assert plan.message in plan.summary()
