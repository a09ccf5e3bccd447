"""The bucket search (autoplan.planner.bucket_search): plans solved again with the bucket
kinds a plan merges charged their shares of a launch, the cheapest estimate kept."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import autoplan
import autoplan.planner.bucket_search as bucket_search
from autoplan.core.torch_adapter import Replicate
from autoplan.ilp.formulation.build import Warm
from autoplan.models import hf
from autoplan.planner.bucket_search import search_buckets
from autoplan.planner.front_end import front_end, untimed
from autoplan.tools.runfile import load_topology
from tests.helpers.paths import REPO

DDP = ("tail", "all_reduce", (0,))  # data parallelism's gradient all-reduces over dp
CALIBRATED = load_topology(str(REPO / "benchmarks" / "cpu-gloo-2x2.yaml"))
QWEN2 = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 128,
}


def _plan_qwen2(**config) -> autoplan.Plan:
    """A 2-layer Qwen2 on dp=4, priced by this repository's calibrated CPU topology."""
    return autoplan.plan(
        hf.build_hf("qwen2", QWEN2, device="meta"),
        lambda: torch.randint(0, 1024, (8, 128)),
        autoplan.fake_mesh((4,), ("dp",)),
        input_placements=["S(0)"],
        loss_fn=lambda out: out.float().square().mean(),
        config=autoplan.PlanConfig(topology=CALIBRATED, **config),
    )


def _qwen2_problem(config: autoplan.PlanConfig):
    """The priced problem of :func:`_plan_qwen2`'s model and mesh under ``config``."""
    return front_end(
        hf.build_hf("qwen2", QWEN2, device="meta"),
        lambda: torch.randint(0, 1024, (8, 128)),
        autoplan.fake_mesh((4,), ("dp",)),
        config=config,
        input_placements=["S(0)"],
        loss_fn=lambda out: out.float().square().mean(),
    )


@pytest.fixture(scope="module")
def qwen2_plans():
    """The plan solved once (no search rounds) and the searched one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bucket_search, "ROUNDS", 0)
        first = _plan_qwen2()
    return first, _plan_qwen2()


def test_many_small_gradients_priced_as_their_bucket_make_the_choice_data_parallel(
    qwen2_plans,
):
    """Priced a launch per gradient, data parallelism looks dearer than a plan with fewer,
    larger moves; with the gradients' all-reduce sharing one launch the planner replicates
    every parameter, estimated far cheaper with the buckets each step runs."""
    first, searched = qwen2_plans
    assert any(p != (Replicate(),) for p in first.param_placements.values())
    assert set(searched.param_placements.values()) == {(Replicate(),)}
    assert searched.estimated_step_us < 0.8 * first.estimated_step_us
    assert "Solved again" in searched.message and "tail all_reduce over dp" in searched.message
    # the gradients fill one bucket, whose launch their shares add up to
    assert searched.estimated_step_us == pytest.approx(searched.objective_us, rel=1e-3)
    (bucket,) = [b for b in searched.buckets if b.where == "tail"]
    assert bucket.kind == "all_reduce" and bucket.members == len(searched.param_placements)
    assert first.shared_launches == () and searched.shared_launches == (DDP,)


def test_a_searched_plan_saves_and_loads_with_its_shared_launches(qwen2_plans, tmp_path):
    _, searched = qwen2_plans
    searched.save(tmp_path / "plan.json")
    loaded = autoplan.Plan.load(tmp_path / "plan.json")
    assert loaded == searched and loaded.shared_launches == (DDP,)


@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_a_plan_solved_again_is_kept_only_when_estimated_cheaper(qwen2_plans, scale):
    """Whatever the solve with kinds opened returns, the plan returned is the cheaper
    estimate of it and the first solve's, and a replaced plan says so."""
    first, _ = qwen2_plans
    config = autoplan.PlanConfig(topology=CALIBRATED)
    solved = []

    def solve(problem, room):
        assert problem.launch is not None and problem.launch.open  # priced with shares
        assert room == 0.0  # no budget: no room kept for the transient
        solved.append(replace(first, objective_us=first.objective_us * scale))
        return solved[-1]

    with _qwen2_problem(config) as problem:
        plan = search_buckets(problem, first, solve, untimed)
    assert len(solved) == 1  # the second round would open no further kind
    if scale > 1:
        assert plan is first
    else:
        assert plan.estimated_step_us < first.estimated_step_us
        assert plan.param_placements == first.param_placements
        assert "Solved again" in plan.message


def test_a_plan_whose_buckets_save_little_is_solved_once(monkeypatch):
    """No bucket saves WORTH of the step: the plan is the first solve's, and no solve ran
    with kinds opened (a solve that ran would have timed its "buckets" phase)."""
    plan = _plan_qwen2(bucket_mib=0)
    assert "buckets" not in plan.timings and "Solved again" not in plan.message
    monkeypatch.setattr(bucket_search, "WORTH", 10.0)  # more than any step
    plan = _plan_qwen2()
    assert "buckets" not in plan.timings and "Solved again" not in plan.message
    assert any(p != (Replicate(),) for p in plan.param_placements.values())


def test_the_problem_solved_again_starts_its_ascent_where_the_first_solve_ended():
    """The re-priced problem carries the memory multiplier the first solve's ascent ended
    at (its built ILP's warm state), and none before any solve."""
    with _qwen2_problem(autoplan.PlanConfig(topology=CALIBRATED)) as problem:
        assert bucket_search.with_shared_launches(problem, {DDP}).memory_price is None
        problem.built["none"] = (SimpleNamespace(warm=Warm((), 2.5)), 0)  # type: ignore[assignment]
        assert bucket_search.with_shared_launches(problem, {DDP}).memory_price == 2.5


@pytest.mark.parametrize(
    "budget_gib,activations,first_bytes,room",
    [
        (100.0, True, 2**30, 123.0 * 2**20),  # the first plan fits: its transient is kept
        (100.0, True, 100.0 * 2**30, 0.0),  # it does not fit: nothing kept
        (100.0, False, 2**30, 0.0),  # the budget does not count activations
        (None, True, 2**30, 0.0),  # no budget
    ],
)
def test_the_searched_solves_keep_room_for_the_first_plans_transient(
    qwen2_plans, budget_gib, activations, first_bytes, room
):
    """Solved again with the first plan's modes, a plan's transient is near the first's:
    the searched solves keep it from the start when the first plan fits a budget that
    counts activations (else they would fill the budget and be solved again)."""
    first, _ = qwen2_plans
    breakdown = dict(first.memory_breakdown, transient=123.0 * 2**20)
    first = replace(first, memory_bytes=first_bytes, memory_breakdown=breakdown)
    config = autoplan.PlanConfig(
        topology=CALIBRATED, memory_budget_gib=budget_gib, activation_memory=activations
    )
    rooms = []

    def solve(problem, kept):
        rooms.append(kept)
        return first

    with _qwen2_problem(config) as problem:
        search_buckets(problem, first, solve, untimed)
    assert rooms == [room]
