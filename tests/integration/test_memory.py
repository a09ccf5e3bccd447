"""Memory per device: the plan's breakdown (parameters, gradients, optimizer state, saved
activations, backward transient), the budget that counts activations, and the estimate
against the peak PyTorch's MemTracker measures on 4 gloo processes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

import autoplan
from autoplan.core.torch_adapter import MemTracker
from autoplan.models.llama3 import Transformer, tiny
from autoplan.planner import bucket_search
from autoplan.planner.front_end import front_end
from autoplan.planner.pipeline import _plan_fields
from autoplan.planner.solve_mode import solve_mode
from autoplan.runtime.apply import parallelize, shard_inputs
from autoplan.tools.compare import compare, format_compare
from autoplan.tools.explain import explain, format_explain
from autoplan.tools.rebuild import rebuild
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run
from tests.helpers.memory_plans import BATCH, CATEGORIES, SEQ, plan_llama
from tests.helpers.paths import REPO

COUNTED = CATEGORIES[:5]  # what a budget counting activations caps


def test_a_budget_counting_activations_shards_them_and_is_met():
    """The budget caps parameters, gradients, optimizer state and the kept activations;
    the plan's peak with the backward's transient is within it too (its first plan was
    over, so it was solved again keeping room for the transient). A 4-way mesh keeps
    the budgeted solves short."""
    free = plan_llama((4,))
    everything = sum(free.memory_breakdown[k] for k in ("parameters", "gradients", "optimizer"))
    everything += free.memory_breakdown["activations"]
    budget = 0.7 * everything
    plan = plan_llama((4,), memory_budget_gib=budget / 2**30, activation_memory=True)
    assert plan.status == "optimal"
    b = plan.memory_breakdown
    counted = sum(b[k] for k in COUNTED)
    assert plan.memory_bytes == pytest.approx(counted)
    assert counted + b["transient"] <= budget * (1 + 1e-9)
    assert "The budget kept" in plan.message and "transient peak" in plan.message
    assert b["activations"] < free.memory_breakdown["activations"]
    # merged into their producers, followers bring their activations along: the budget the
    # solver saw is the one the whole graph meets
    plain = plan_llama(
        (4,), memory_budget_gib=budget / 2**30, activation_memory=True, collapse_followers=False
    )
    assert plain.status == "optimal" and plain.memory_bytes <= budget * (1 + 1e-9)


def test_the_transient_re_solve_moves_the_built_ilp_to_its_budget(monkeypatch):
    """Solved again with room for the transient, a plan reuses the ILP its first solve
    built (only the memory row's bound moves) and equals the plan of an ILP built anew."""
    from autoplan.ilp.formulation.build import IlpModel
    from autoplan.planner import bucket_search
    from autoplan.planner import solve_mode as solve_stage

    monkeypatch.setattr(bucket_search, "ROUNDS", 0)  # the builds of the transient's alone
    free = plan_llama((4,))
    budget = 0.7 * sum(free.memory_breakdown[k] for k in COUNTED) / 2**30
    built = []
    build = solve_stage.build_ilp
    monkeypatch.setattr(solve_stage, "build_ilp", lambda *a, **k: built.append(1) or build(*a, **k))
    reused = plan_llama((4,), memory_budget_gib=budget, activation_memory=True)
    assert "The budget kept" in reused.message and len(built) == 1
    monkeypatch.setattr(IlpModel, "with_budget", lambda self, budget: None)
    again = plan_llama((4,), memory_budget_gib=budget, activation_memory=True)
    assert len(built) == 3
    assert reused.objective_us == again.objective_us
    assert reused.node_placements == again.node_placements
    assert reused.memory_breakdown == again.memory_breakdown


def test_a_mode_per_layer_solved_again_under_a_smaller_budget_reuses_its_ilp(monkeypatch):
    """The bucket search solves with auto's mode per layer kept; that plan's transient
    re-solve reuses the reduced table and moves the ILP those modes built, as a uniform
    mode's does, to a plan as cheap as an ILP built anew gives."""
    from autoplan.planner import solve_mode as solve_stage

    free = plan_llama((4,))
    budget = 0.7 * sum(free.memory_breakdown[k] for k in COUNTED)
    config = autoplan.PlanConfig(memory_budget_gib=budget / 2**30, activation_memory=True)
    modes = {"layers.0": "none", "layers.1": "selective"}
    built = []
    build = solve_stage.build_ilp
    monkeypatch.setattr(solve_stage, "build_ilp", lambda *a, **k: built.append(1) or build(*a, **k))
    reduced = []
    collapse = solve_stage.collapse_followers
    monkeypatch.setattr(
        solve_stage, "collapse_followers", lambda *a, **k: reduced.append(1) or collapse(*a, **k)
    )
    tokens = torch.randint(0, 128, (BATCH, SEQ))
    with torch.device("meta"):
        meta = Transformer(tiny(2))
    mesh = autoplan.fake_mesh((4,), ("dp",))
    with front_end(meta, lambda: tokens, mesh, config=config, input_placements="S(0)") as problem:
        base = _plan_fields(problem.traced, problem.table, config, {})
        first = solve_mode(problem, modes, base, _untimed)
        reserve = budget - 0.9 * first.memory_bytes  # a budget first does not meet
        again = solve_mode(problem, modes, base, _untimed, reserve=reserve)
        assert len(built) == len(reduced) == 1
        fresh = solve_mode(
            replace(problem, built={}, reductions={}), modes, base, _untimed, reserve=reserve
        )
    assert len(built) == len(reduced) == 2
    assert again.status == fresh.status == "optimal" and first.status == "optimal"
    assert again.memory_bytes <= budget - reserve < first.memory_bytes
    # Equal plans by cost and memory: the two ILPs start from different incumbents, and
    # between optimal plans of equal price either may come back.
    assert again.objective_us == fresh.objective_us
    assert again.memory_bytes == fresh.memory_bytes
    assert again.checkpointing == fresh.checkpointing == modes


def _memory_check(table: str) -> list[dict]:
    """scripts/memory_check.py's rows of ``table``, run on 4 gloo processes."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "memory_check.py"), "--json", "--table", table],
        capture_output=True, text=True, timeout=1800, env=env, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _check_categories(r: dict) -> None:
    """Parameters and optimizer state within 1 %, activations within 1 % and the input."""
    for cat in ("parameters", "optimizer"):
        plan, seen = r[cat]
        assert abs(plan - seen) <= 0.01 * seen, (r["setting"], cat, plan, seen)
    plan, seen = r["activations"]
    assert abs(plan - seen) <= 0.01 * seen + 4096, (r["setting"], plan, seen)  # + the input


def test_the_estimate_is_within_ten_percent_of_the_measured_peak():
    """scripts/memory_check.py: six plans stepped on 4 gloo processes under MemTracker,
    one of them auto's under a budget (whatever mix of modes it picks: every mix is
    checked on its own above)."""
    rows = _memory_check("settings")
    assert [r["setting"] for r in rows] == [
        "no budget",
        "params budget",
        "activations budget",
        "selective",
        "full",
        "auto",
    ]
    for r in rows:
        _check_categories(r)
        assert 0.9 <= r["ratio"] <= 1.1, r


@pytest.mark.slow  # nine plans at seq 512 on 4 gloo processes: several minutes
def test_the_readme_step_is_within_five_percent_of_the_measured_peak():
    """The README's step (loss outside, and inside with loss_fn) under each checkpointing
    mode and auto: the plan's peak within 5 % of MemTracker's; DTensor's out.mean(),
    whose backward replicates the output's gradient at full size, is measured above."""
    rows = _memory_check("step")
    *counted, mean = rows
    assert len(counted) == 8 and "mean" in mean["setting"]
    for r in counted:
        _check_categories(r)
        assert 0.95 <= r["ratio"] <= 1.05, r
    assert mean["peak"][1] > counted[0]["peak"][1]  # what the plan leaves to the loss


# Each layer's attention value and feed-forward input weights sharded as FSDP shards them:
# the forward gathers them, and a layer the backward recomputes gathers them again.
GATHERED = {
    f"layers.{i}.{w}": p
    for i in range(2)
    for w, p in (("attention.wv.weight", "S(1)"), ("feed_forward.w1.weight", "S(0)"))
}


def test_the_kept_activations_are_what_memtracker_measures_for_every_mix_of_modes():
    """Each of the 9 mixes of none/selective/full over 2 layers (per layer, given
    explicitly), planned with gathered weights on 4 ranks and stepped under MemTracker:
    the plan's activations are what the step keeps, besides the input's shard, and its
    peak (no optimizer here) is within 5 % of the step's. The step runs on rank 0 of a
    fake 4-rank group in this process, where a collective allocates its result as on
    gloo but moves nothing (the same bytes as rank 0 of 4 gloo processes)."""
    mesh = autoplan.fake_mesh((4,), ("dp",))
    tokens = torch.randint(0, 128, (BATCH, SEQ))
    with torch.device("meta"):
        meta = Transformer(tiny(2))
    config = autoplan.PlanConfig()
    with front_end(
        meta, lambda: tokens, mesh, config=config, input_placements="S(0)", pins=GATHERED
    ) as problem:
        base = _plan_fields(problem.traced, problem.table, config, {})
        plans = {
            mix: solve_mode(problem, {"layers.0": mix[0], "layers.1": mix[1]}, base, _untimed)
            for mix in itertools.product(("none", "selective", "full"), repeat=2)
        }
    input_bytes = tokens.numel() * tokens.element_size() // 4
    for mix, plan in plans.items():
        assert plan.checkpointing == {"layers.0": mix[0], "layers.1": mix[1]}
        model = Transformer(tiny(2))
        model.init_weights(seed=0)
        pm = parallelize(model, plan, mesh)
        (x,) = shard_inputs(tokens, plan, mesh)
        pm(x).to_local().float().pow(2).mean().backward()  # lowers the plan
        pm.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(pm)
        with tracker:
            out = pm(x)  # held, as the caller holds it through its loss and the backward
            out.to_local().float().pow(2).mean().backward()
        seen = {
            getattr(k, "value", k): v
            for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()
        }
        b = plan.memory_breakdown
        kept = seen["Activation"]
        assert kept - input_bytes - 64 <= b["activations"] <= kept - input_bytes, (mix, b, kept)
        peak = sum(v for k, v in b.items() if k != "optimizer")
        assert 0.95 <= peak / seen["Total"] <= 1.05, (mix, b, seen)
    kept_bytes = {mix: plan.memory_breakdown["activations"] for mix, plan in plans.items()}
    assert kept_bytes[("full", "full")] < kept_bytes[("none", "none")]


def _untimed(phase: str):
    return lambda: None


def test_checkpointing_keeps_less_and_prices_the_recomputation():
    """Selective keeps less than none and full less than selective; each recomputation is
    priced (a dearer step) and named in the plan, the recomputed nodes closed under
    their layer's inputs."""
    plans = {
        mode: plan_llama(activation_checkpointing=mode) for mode in ("none", "selective", "full")
    }
    kept = {m: p.memory_breakdown["activations"] for m, p in plans.items()}
    assert kept["full"] < kept["selective"] < kept["none"]
    assert plans["none"].recompute == [] and "checkpointing" not in plans["none"].summary()
    assert len(plans["full"].recompute) > len(plans["selective"].recompute) > 0
    assert plans["none"].compute_us < plans["selective"].compute_us < plans["full"].compute_us
    assert plans["full"].checkpointing == {"layers.0": "full", "layers.1": "full"}
    selective = {plans["selective"].node_placements[n]["op"] for n in plans["selective"].recompute}
    assert not selective & {"aten.einsum.default", "aten.mm.default"}  # matmuls are kept
    assert "aten.einsum.default" in {
        plans["full"].node_placements[n]["op"] for n in plans["full"].recompute
    }
    assert "activation checkpointing: full in 2 layers" in plans["full"].summary()
    again = autoplan.Plan.from_json(plans["full"].to_json())
    assert again.recompute == plans["full"].recompute


def test_auto_recomputes_nothing_with_room_and_fits_a_tight_budget(monkeypatch):
    """auto counts activations: with room it recomputes nothing; under a tight budget its
    plan's peak fits and costs no more than full checkpointing's; below every mode it
    says so (a 4-way data-parallel mesh keeps the solves short). Solved once each: the
    bucket search prices each plan again by the kinds it merges, so two searched plans'
    objectives are priced differently."""
    monkeypatch.setattr(bucket_search, "ROUNDS", 0)
    roomy = plan_llama((4,), activation_checkpointing="auto", memory_budget_gib=0.004)
    assert set(roomy.checkpointing.values()) == {"none"} and roomy.status == "optimal"
    tight = plan_llama((4,), activation_checkpointing="auto", memory_budget_gib=0.0014)
    assert tight.status == "optimal"
    assert tight.memory_bytes <= 0.0014 * 2**30
    b = tight.memory_breakdown
    assert tight.memory_bytes == pytest.approx(sum(b[k] for k in COUNTED))
    assert tight.memory_bytes + b["transient"] <= 0.0014 * 2**30  # the peak fits too
    full = plan_llama(
        (4,), memory_budget_gib=0.0014, activation_checkpointing="full", activation_memory=True
    )
    assert tight.objective_us <= full.objective_us * (1 + 1e-9)
    too_small = plan_llama((4,), activation_checkpointing="auto", memory_budget_gib=0.0002)
    assert too_small.status == "infeasible"
    assert "(checkpointing: auto, any mode per layer)" in too_small.message
    assert "recompute more" not in too_small.message


def test_compare_and_explain_show_the_memory_side():
    """compare lists each mode's breakdown and checkpointing; explain prices the kept
    activations of a node's alternatives, the plan's recomputation included."""
    run = load_run(
        REPO / "configs" / "tiny.yaml",
        ["plan.activation_checkpointing=selective", "plan.activation_memory=true"],
    )
    result = compare(run, quiet=True)
    text = format_compare(result)
    assert "saved activations" in text and "activation checkpointing" in text
    for mode in ("einsum", "native"):
        b = result[mode]["memory_breakdown"]
        assert set(b) == set(CATEGORIES)
        assert result[mode]["checkpointing"] == ["selective"]
    plan = run_plan(run, quiet=True)
    rb = rebuild(run, plan)
    assert rb.costs.activations and set(rb.costs.activations) <= set(rb.costs.memory)
    kept = max(rb.costs.activations, key=lambda v: np.ptp(rb.costs.activations[v]))
    r = explain(rb, kept, top=10_000)
    assert any(a["activation_delta_bytes"] for a in r["alternatives"])
    assert "(saved activations" in format_explain(r)


def test_the_breakdown_adds_up_and_the_budget_leaves_activations_out_unless_asked():
    """The breakdown's categories, the parameters' three states, a budget of parameters
    alone, the output's gradient (a local shard of the logits) and the JSON round trip."""
    plan = plan_llama()
    b = plan.memory_breakdown
    assert set(b) == set(CATEGORIES)
    assert b["gradients"] == b["parameters"] and b["optimizer"] == 2 * b["parameters"]
    assert plan.memory_bytes == pytest.approx(b["parameters"] * 4)
    assert b["activations"] > plan.memory_bytes  # most of the memory at this sequence
    assert "saved activations" in plan.summary() and "output's gradient" in plan.summary()
    logits = BATCH * SEQ * 128 * 4  # float32, vocabulary 128
    assert b["output_grad"] in {logits, logits / 2, logits / 4}  # a local shard on 2x2
    again = autoplan.Plan.from_json(plan.to_json())
    assert again.memory_breakdown == b


def test_too_small_a_budget_with_activations_says_they_are_counted():
    plan = plan_llama(memory_budget_gib=1e-4, activation_memory=True)
    assert plan.status == "infeasible"
    assert "parameters + gradients + optimizer state (" in plan.message
    assert (
        "+ saved activations (" in plan.message and "GiB over (checkpointing: none)" in plan.message
    )
    assert "activation_checkpointing: full" in plan.message  # the lever left
