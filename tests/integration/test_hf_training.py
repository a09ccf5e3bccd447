"""Hugging Face causal LMs trained on their own loss: ``pm(**batch).loss.backward()``.

Four gloo processes on a 2x2 (dp, tp) mesh, as a ``torchrun`` job. GPT-2 and LLaMA tiny
configs, as ``transformers`` builds them (``forward(input_ids=, labels=)`` returns an
output object whose ``loss`` the model computes), are planned in the job from a dict
``input_fn`` (``input_ids``, ``attention_mask``, ``labels``) under a memory budget that
makes them shard (LLaMA with full activation checkpointing), and train three AdamW steps
fed keyword batches: each loss equal to one device's, and no gloo worker thread left to
free a buffer of the step's collectives once a backward or ``full_gradients`` returns (the
state that aborts a job at exit). Then the bad calls a user makes.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.core.placements import fmt
from autoplan.models import hf
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs
from tests.helpers.gloo import gil_waiters, run_workers

pytest.importorskip("transformers")

WORLD, BATCH, SEQ, VOCAB, LR = 4, 8, 16, 128, 1e-2
CONFIGS = {
    "gpt2": ({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": VOCAB}, 0.0008),
    "llama": (
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": VOCAB,
        },
        0.001,
    ),
}  # each with a budget below its replicated footprint: the plan must shard
# LLaMA recomputes its layers in the backward (full activation checkpointing)
CHECKPOINTING = {"gpt2": "none", "llama": "full"}


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.roll(-1, 1)}


def _train(kind: str, mesh) -> dict:
    config, budget = CONFIGS[kind]
    plan = autoplan.plan(
        hf.build_hf(kind, config, logits_only=False),
        lambda: _batch(0),
        mesh,
        input_placements="S(0)R",
        config=autoplan.PlanConfig(
            memory_budget_gib=budget, activation_checkpointing=CHECKPOINTING[kind]
        ),
        broadcast_from=0,
    )
    torch.manual_seed(0)
    ref = hf.build_hf(kind, config, device="cpu", logits_only=False)
    pm = parallelize(copy.deepcopy(ref), plan, mesh)
    opt = torch.optim.AdamW(pm.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    losses, waiting = [], []
    for step in range(3):  # one batch, fitted: the loss must fall
        batch = _batch(0)
        out = pm(**shard_inputs(batch, plan, mesh))
        out.loss.backward()
        waiting.append(gil_waiters())
        if step == 2:  # a collective of its own, as a check at a job's end would run
            full_gradients(pm)
            waiting.append(gil_waiters())
        opt.step()
        opt.zero_grad()
        ref_loss = ref(**batch).loss
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append((out.loss.item(), ref_loss.item()))
    batch = shard_inputs(_batch(0), plan, mesh)
    errors = {}
    for name, call in {
        "unknown_key": lambda: pm(**batch, position_ids=batch["labels"]),
        "missing_key": lambda: pm(input_ids=batch["input_ids"]),
        "other_shape": lambda: pm(**shard_inputs(_half(_batch(0)), plan, mesh)),
    }.items():
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return {
        "placements": sorted({fmt(p) for p in plan.param_placements.values()}),
        "checkpointing": sorted(set(plan.checkpointing.values())),
        "recomputed": len(plan.recompute),
        "output": type(out).__name__,
        "losses": losses,
        "waiting": waiting,
        "errors": errors,
    }


def _half(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v[:, : SEQ // 2] for k, v in batch.items()}


def _job(rank: int) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    return {kind: _train(kind, mesh) for kind in CONFIGS}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    return run_workers(_job, WORLD, str(tmp_path_factory.mktemp("out")))


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_the_plan_shards_the_model(job, kind):
    assert set(job[0][kind]["placements"]) - {"RR"}
    assert job[0][kind]["checkpointing"] == [CHECKPOINTING[kind]]  # each HF layer, tagged
    assert (job[0][kind]["recomputed"] > 0) == (CHECKPOINTING[kind] == "full")


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_out_loss_trains_as_on_one_device(job, kind):
    for r in job:
        assert r[kind]["output"].startswith("CausalLMOutput")
        for parallel, one in r[kind]["losses"]:
            assert parallel == pytest.approx(one, rel=1e-4)
        first, last = r[kind]["losses"][0][0], r[kind]["losses"][-1][0]
        assert last < first


def test_no_gloo_worker_is_left_to_free_a_buffer_after_a_step(job):
    """After each backward and after full_gradients, no gloo worker thread waits for the GIL
    to free a buffer of the step's collectives: the state in which the interpreter's
    teardown aborts the process ("terminate called without an active exception")."""
    for rank, r in enumerate(job):
        for kind in CONFIGS:
            assert r[kind]["waiting"] == [0, 0, 0, 0], (rank, kind, r[kind]["waiting"])


@pytest.mark.parametrize(
    "call, message",
    [
        ("unknown_key", r"TypeError: .*keyword input 'position_ids', which the plan does not"),
        (
            "missing_key",
            r"TypeError: .*planned for keyword inputs input_ids, attention_mask, labels but got ",
        ),
        ("other_shape", r"PlanError: input 'input_ids' has global shape \(8, 8\).*\(8, 16\)"),
    ],
)
def test_a_call_the_plan_does_not_fit_names_the_input(job, call, message):
    for r in job:
        for kind in CONFIGS:
            assert re.search(message, r[kind]["errors"][call] or ""), r[kind]["errors"][call]
