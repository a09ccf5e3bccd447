"""The whole pipeline on tiny models: budgets, constraints, infeasibility, JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

import autoplan
from autoplan.core.placements import fmt
from autoplan.core.torch_adapter import Replicate, Shard
from autoplan.result.plan import PHASES
from tests.helpers.planning import SLOW_DEVICES, plan_mlp


def test_no_budget_gives_replicated_weights_ddp_like(meta_mlp, mesh8):
    """Without a memory limit (and with compute that matters), data parallelism with
    replicated weights is cheapest."""
    plan = plan_mlp(meta_mlp, mesh8, topology=SLOW_DEVICES)
    assert plan.status == "optimal"
    assert all(p == (Replicate(),) for p in plan.param_placements.values())
    assert plan.comm["all_reduce"]["count"] >= len(plan.param_placements)


def test_tight_budget_gives_sharded_weights_fsdp_like(meta_mlp, mesh8):
    """A budget below replicated weights forces every weight to be sharded."""
    replicated = 4 * 4 * sum(p.numel() for p in meta_mlp.parameters())
    plan = plan_mlp(meta_mlp, mesh8, memory_budget_gib=replicated / 4 / 2**30)
    assert plan.status == "optimal"
    assert all(isinstance(p[0], Shard) for p in plan.param_placements.values())
    assert plan.memory_bytes <= replicated / 4
    assert "all_gather" in plan.comm


def test_objective_is_compute_plus_comm(meta_mlp, mesh8):
    """The reported objective splits exactly into compute and comm."""
    plan = plan_mlp(meta_mlp, mesh8)
    assert plan.objective_us == pytest.approx(plan.compute_us + plan.comm_us)
    assert set(plan.timings) == set(PHASES) - {"buckets"}  # timed when a bucket search runs
    assert plan.ilp_size["variables"] > 0


def test_input_placement_is_honoured(meta_mlp, mesh8):
    """The input node runs the placement the user asked for."""
    plan = plan_mlp(meta_mlp, mesh8)
    inputs = [v for v in plan.node_placements.values() if v["op"] == "placeholder"]
    assert any(v["out"] == ["S(0)"] for v in inputs)
    plan_r = autoplan.plan(
        meta_mlp, lambda: torch.randn(16, 32, 64), mesh8, input_placements=[(Replicate(),)]
    )
    name = next(n for n in plan_r.node_placements if n.startswith("xs"))
    assert plan_r.node_placements[name]["out"] == ["R"]


def test_impossible_input_placement_is_a_clear_error(meta_mlp, mesh8):
    """Sharding a dim that does not divide by the mesh names the placement and the rule."""
    with pytest.raises(ValueError, match="divide evenly"):
        autoplan.plan(meta_mlp, lambda: torch.randn(3, 32, 64), mesh8, input_placements=["S(0)"])


def test_infeasible_budget_names_budget_and_smallest_feasible(meta_mlp, mesh8):
    """A budget below the fully sharded footprint is infeasible and says what would fit."""
    plan = plan_mlp(meta_mlp, mesh8, memory_budget_gib=1e-6)
    assert plan.status == "infeasible"
    assert "memory_budget_gib (1e-06)" in plan.message
    smallest = 4 * 4 * sum(p.numel() for p in meta_mlp.parameters()) / 8
    assert f"({smallest:.0f} bytes)" in plan.message
    assert math.isnan(plan.objective_us)


def test_plan_json_round_trips_exactly(meta_mlp, mesh8, tmp_path):
    """save then load gives an equal Plan, placements included."""
    plan = plan_mlp(meta_mlp, mesh8, memory_budget_gib=3e-4)
    assert plan.status == "optimal"
    path = tmp_path / "plan.json"
    plan.save(path)
    again = autoplan.Plan.load(path)
    assert again == plan
    assert again.to_json() == plan.to_json()
    assert {fmt(p) for p in again.param_placements.values()} <= {"S(0)", "S(1)", "R"}
    assert again.bound_us == plan.bound_us is not None and 0.0 <= plan.gap < 1e-9
    old = json.loads(plan.to_json())
    del old["bound_us"]  # a plan saved before the bound was kept
    assert math.isnan(autoplan.Plan.from_json(json.dumps(old)).gap)


def test_plan_within_mip_gap_reports_its_gap_and_bound(meta_mlp, mesh8):
    """With plan.mip_gap the plan is "optimal" within it: the bound and the gap say how far."""
    plan = plan_mlp(meta_mlp, mesh8, memory_budget_gib=3e-4, mip_gap=0.05)
    assert plan.status == "optimal" and plan.bound_us <= plan.objective_us
    assert 0.0 <= plan.gap <= 0.05 + 1e-9  # proved within the gap allowed, no closer
    assert f"optimal (gap {plan.gap:.3%})" in plan.summary()


def test_summary_lists_phases_status_and_params(meta_mlp, mesh8):
    """The summary shows timings, ILP size, status, objective split and placements by kind."""
    text = plan_mlp(meta_mlp, mesh8).summary()
    for needle in ("phases (s):", "ILP:", "optimal", "compute", "comm", "w1", "w2"):
        assert needle in text


def test_planning_leaves_the_garbage_collector_unfrozen(meta_mlp, mesh8):
    """The heap frozen after the trace goes back to the collector whether the plan is made
    or planning fails on bad input."""
    import gc

    before = gc.get_freeze_count()
    assert plan_mlp(meta_mlp, mesh8).status == "optimal"
    assert gc.get_freeze_count() == before
    with pytest.raises(ValueError, match="input_placements"):
        autoplan.plan(meta_mlp, lambda: torch.randn(16, 32, 64), mesh8, input_placements=["S(7)"])
    assert gc.get_freeze_count() == before
