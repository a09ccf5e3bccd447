"""Memory per device: the plan's breakdown (parameters, gradients, optimizer state, saved
activations, backward transient), the budget that counts activations, and the estimate
against the peak PyTorch's MemTracker measures on 4 gloo processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autoplan
from autoplan.cost.activations import saved_storage
from autoplan.models.llama3 import Transformer, tiny
from autoplan.trace import trace_joint

ROOT = Path(__file__).resolve().parents[1]
BATCH, SEQ = 8, 32


def _plan(**config) -> autoplan.Plan:
    with torch.device("meta"):
        model = Transformer(tiny(2))
    return autoplan.plan(
        model,
        lambda: torch.randint(0, 128, (BATCH, SEQ)),
        autoplan.fake_mesh((2, 2), ("dp", "tp")),
        input_placements="S(0)R",
        config=autoplan.PlanConfig(**config),
    )


def test_the_kept_values_are_forward_values_the_backward_reads_never_placeholders():
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced = trace_joint(model, lambda: torch.randint(0, 128, (BATCH, SEQ)))
    kept = [traced.node(n) for n in saved_storage(traced)]
    assert kept and all(n.op == "call_function" for n in kept)
    assert traced.node(traced.outputs[0]) in kept  # the logits the caller holds
    ops = {str(n.target) for n in kept}
    assert "aten.embedding.default" in ops and "aten.rsqrt.default" in ops
    assert not any(getattr(n.target, "is_view", False) for n in kept)  # bases, not views


def test_the_breakdown_adds_up_and_the_budget_leaves_activations_out_unless_asked():
    plan = _plan()
    b = plan.memory_breakdown
    assert set(b) == {"parameters", "gradients", "optimizer", "activations", "transient"}
    assert b["gradients"] == b["parameters"] and b["optimizer"] == 2 * b["parameters"]
    assert plan.memory_bytes == pytest.approx(b["parameters"] * 4)
    assert b["activations"] > plan.memory_bytes  # most of the memory at this sequence
    assert "saved activations" in plan.summary()
    again = autoplan.Plan.from_json(plan.to_json())
    assert again.memory_breakdown == b


def test_a_budget_counting_activations_shards_them_and_is_met():
    free = _plan()
    everything = sum(free.memory_breakdown[k] for k in ("parameters", "gradients", "optimizer"))
    everything += free.memory_breakdown["activations"]
    budget = 0.6 * everything
    plan = _plan(memory_budget_gib=budget / 2**30, activation_memory=True)
    assert plan.status == "optimal"
    b = plan.memory_breakdown
    counted = b["parameters"] + b["gradients"] + b["optimizer"] + b["activations"]
    assert plan.memory_bytes == pytest.approx(counted)
    assert counted <= budget * (1 + 1e-9)
    assert b["activations"] < free.memory_breakdown["activations"]
    # merged into their producers, followers bring their activations along: the budget the
    # solver saw is the one the whole graph meets (the plain ILP can only do better)
    plain = _plan(
        memory_budget_gib=budget / 2**30, activation_memory=True, collapse_followers=False
    )
    assert plain.memory_bytes <= budget * (1 + 1e-9)
    assert plain.objective_us <= plan.objective_us * (1 + 1e-9)


def test_too_small_a_budget_with_activations_says_they_are_counted():
    plan = _plan(memory_budget_gib=1e-4, activation_memory=True)
    assert plan.status == "infeasible"
    assert "parameters + gradients + optimizer state + saved activations" in plan.message


def test_the_estimate_is_within_ten_percent_of_the_measured_peak():
    """scripts/memory_check.py: three plans stepped on 4 gloo processes under MemTracker."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "memory_check.py"), "--json"],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["setting"] for r in rows] == ["no budget", "params budget", "activations budget"]
    for r in rows:
        for cat in ("parameters", "optimizer"):
            plan, seen = r[cat]
            assert abs(plan - seen) <= 0.01 * seen, (r["setting"], cat, plan, seen)
        plan, seen = r["activations"]
        assert abs(plan - seen) <= 0.01 * seen + 4096, (r["setting"], plan, seen)  # + the input
        assert 0.9 <= r["ratio"] <= 1.1, r
