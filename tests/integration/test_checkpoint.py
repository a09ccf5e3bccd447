"""Weights and checkpoints of a parallelized model, with torch's own state-dict tools.

Four gloo processes on a 2x2 (dp, tp) mesh, as a ``torchrun`` job: a tiny LLaMA planned
in the job under a memory budget (plan A, sharded) and without one (plan B, other
placements). The meta model gets its weights from one full state dict broadcast from
rank 0 (``set_model_state_dict``), trains a step of AdamW under plan A, is saved with
``torch.distributed.checkpoint``, and is loaded (model and AdamW state) under plan B (through
``autoplan.runtime.checkpoint.load``) and into a plain one-device model (DCP's own calls): each must hold the same values and take the same next
step as the run that was not interrupted.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

import autoplan
from autoplan.models.llama3 import Transformer, tiny
from autoplan.runtime.apply import parallelize, shard_inputs
from tests.helpers.checkpointing import BATCH, LR, SEQ, WORLD, batch, cross_entropy, max_diff
from tests.helpers.gloo import run_workers
from tests.helpers.planning import plan_tiny_llama

TIGHT_GIB = 0.0006  # below the replicated model's 1.75 MiB: plan A must shard


def _plan(mesh, budget: float | None) -> autoplan.Plan:
    return plan_tiny_llama(
        mesh,
        batch=BATCH,
        seq=SEQ,
        input_placements=["S(0)R"],
        config=autoplan.PlanConfig(memory_budget_gib=budget),
        broadcast_from=0,
    )


def _parallel_step(pm, opt, mesh, step: int) -> float:
    tokens, labels = batch(step)
    (x,) = shard_inputs(tokens, ["S(0)R"], mesh)
    placed = DTensor.from_local(labels, mesh, [Replicate()] * mesh.ndim)
    loss = cross_entropy(pm(x.to_local()), placed).full_tensor()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def _plain_step(model, opt, step: int) -> float:
    tokens, labels = batch(step)
    loss = cross_entropy(model(tokens), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def _full(sd: dict) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}


def _parallelized(plan, mesh, full: dict | None):
    """A meta model under ``plan``, its weights broadcast from rank 0's full state dict
    (which holds no RoPE tables: non-persistent buffers, computed by ``init_fn``)."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    pm = parallelize(model, plan, mesh, init_fn=Transformer.init_buffers)
    set_model_state_dict(
        pm, full or {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    return pm


def _job(rank: int, folder: str) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan_a, plan_b = _plan(mesh, TIGHT_GIB), _plan(mesh, None)
    torch.manual_seed(0)
    ref = Transformer(tiny(2))
    ref.init_weights(seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    out: dict = {
        "placements": [
            {k: autoplan.core.placements.fmt(v) for k, v in p.param_placements.items()}
            for p in (plan_a, plan_b)
        ]
    }
    # weights: only rank 0 holds the full state dict
    pm = _parallelized(plan_a, mesh, ref.state_dict() if rank == 0 else None)
    out["loaded_weights"] = max_diff(_full(pm.state_dict()), ref.state_dict())
    opt = torch.optim.AdamW(pm.parameters(), lr=LR)
    out["step0"] = (_parallel_step(pm, opt, mesh, 0), _plain_step(ref, ref_opt, 0))
    state = {"model": get_model_state_dict(pm), "optim": get_optimizer_state_dict(pm, opt)}
    dcp.save(state, checkpoint_id=folder)
    # the run that goes on, and the one device
    out["step1"] = (_parallel_step(pm, opt, mesh, 1), _plain_step(ref, ref_opt, 1))
    after = _full(pm.state_dict())

    # (a) resumed under plan B, through autoplan.runtime.checkpoint
    with torch.device("meta"):
        model_b = Transformer(tiny(2))
    pm_b = parallelize(model_b, plan_b, mesh, init_fn=Transformer.init_buffers)
    opt_b = torch.optim.AdamW(pm_b.parameters(), lr=LR)
    autoplan.runtime.checkpoint.load(folder, pm_b, opt_b)  # the four lines of (b), checked first
    out["b_step1"] = _parallel_step(pm_b, opt_b, mesh, 1)
    out["b_after"] = max_diff(_full(pm_b.state_dict()), after)

    # (b) resumed on one device, every rank reading the whole of it, with DCP's own calls
    torch.manual_seed(1)
    plain = Transformer(tiny(2))
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=LR)
    state_p = {
        "model": get_model_state_dict(plain),
        "optim": get_optimizer_state_dict(plain, plain_opt),
    }
    dcp.load(state_p, checkpoint_id=folder)
    set_model_state_dict(plain, state_p["model"])
    set_optimizer_state_dict(plain, plain_opt, state_p["optim"])
    out["plain_step1"] = _plain_step(plain, plain_opt, 1)
    out["plain_after"] = max_diff(plain.state_dict(), after)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("ckpt")
    return run_workers(_job, WORLD, str(tmp_path_factory.mktemp("out")), str(folder))


def test_the_two_plans_place_the_weights_differently(job):
    a, b = job[0]["placements"]
    assert a != b


def test_weights_broadcast_from_rank_zero_equal_the_full_state_dict(job):
    assert [r["loaded_weights"] for r in job] == [0.0] * WORLD


def test_training_under_the_plan_equals_one_device(job):
    for r in job:
        for step in ("step0", "step1"):
            parallel, one = r[step]
            assert parallel == pytest.approx(one, rel=1e-4), step


def test_a_checkpoint_resumes_under_another_plan_with_the_same_step(job):
    for r in job:
        assert r["b_step1"] == pytest.approx(r["step1"][0], rel=1e-4)
        assert r["b_after"] <= 1e-5


def test_a_checkpoint_loads_into_one_device_with_its_optimizer_state(job):
    for r in job:
        assert r["plain_step1"] == pytest.approx(r["step1"][0], rel=1e-4)
        assert r["plain_after"] <= 1e-5
