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

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
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
from tests.helpers.gloo import run_workers
from tests.helpers.planning import plan_tiny_llama

WORLD, BATCH, SEQ, VOCAB, LR = 4, 8, 16, 128, 1e-2
TIGHT_GIB = 0.0006  # below the replicated model's 1.75 MiB: plan A must shard


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(
        0, VOCAB, (BATCH, SEQ), generator=g
    )


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


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
    tokens, labels = _batch(step)
    (x,) = shard_inputs(tokens, ["S(0)R"], mesh)
    placed = DTensor.from_local(labels, mesh, [Replicate()] * mesh.ndim)
    loss = _loss(pm(x.to_local()), placed).full_tensor()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def _plain_step(model, opt, step: int) -> float:
    tokens, labels = _batch(step)
    loss = _loss(model(tokens), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def _full(sd: dict) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


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
    out["loaded_weights"] = _max_diff(_full(pm.state_dict()), ref.state_dict())
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
    out["b_after"] = _max_diff(_full(pm_b.state_dict()), after)

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
    out["plain_after"] = _max_diff(plain.state_dict(), after)
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


def test_a_meta_model_with_buffers_no_state_dict_holds_needs_init_fn():
    """The RoPE tables are non-persistent: loading weights would leave them garbage."""
    mesh = autoplan.fake_mesh((4,), ("dp",))
    with torch.device("meta"):
        model = Transformer(tiny(1))
    plan = autoplan.plan(model, lambda: torch.randint(0, VOCAB, (BATCH, SEQ)), mesh)
    with pytest.raises(
        ValueError, match=r"non-persistent buffers \(freqs_cos, freqs_sin\).*init_fn="
    ):
        parallelize(model, plan, mesh)
    pm = parallelize(model, plan, mesh, init_fn=Transformer.init_buffers)
    assert torch.equal(pm.freqs_cos.to_local(), Transformer(tiny(1)).freqs_cos)  # replicated


def _saved(tmp_path, n_layers: int = 2):
    torch.manual_seed(0)
    model = Transformer(tiny(n_layers))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens, labels = _batch(0)
    _loss(model(tokens), labels).backward()
    opt.step()
    folder = tmp_path / "ckpt"
    autoplan.runtime.checkpoint.save(folder, model, opt, step=7)
    return folder, model, opt


def test_checkpoint_save_and_load_give_back_weights_optimizer_and_step(tmp_path):
    """One process, no plan: the wrapper round-trips weights, AdamW state and its extras."""
    folder, model, opt = _saved(tmp_path)
    again = Transformer(tiny(2))
    again_opt = torch.optim.AdamW(again.parameters(), lr=LR)
    assert autoplan.runtime.checkpoint.load(folder, again, again_opt) == {"step": 7}
    assert _max_diff(again.state_dict(), model.state_dict()) == 0.0
    assert (
        _max_diff(
            get_optimizer_state_dict(again, again_opt)["state"]["output.weight"],
            get_optimizer_state_dict(model, opt)["state"]["output.weight"],
        )
        == 0.0
    )


@pytest.mark.parametrize(
    "other, message",
    [
        # DCP alone loads this one without a word: the checkpoint's second layer is dropped
        (lambda: Transformer(tiny(1)), r"holds 9 weights Transformer does not have \(layers\.1\."),
        (lambda: Transformer(tiny(3)), r"lacks 9 of Transformer's weights \(layers\.2\."),
        (
            lambda: Transformer(dataclasses.replace(tiny(2), dim=128)),
            r"tok_embeddings\.weight: saved \(128, 64\), model \(128, 128\)",
        ),
    ],
)
def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path, other, message):
    folder, *_ = _saved(tmp_path)
    model = other()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(autoplan.runtime.checkpoint.CheckpointMismatch, match=message):
        autoplan.runtime.checkpoint.load(folder, model)
    assert _max_diff(model.state_dict(), before) == 0.0  # nothing loaded


def test_a_missing_checkpoint_or_optimizer_state_is_named(tmp_path):
    with pytest.raises(
        autoplan.runtime.checkpoint.CheckpointMismatch, match=r"no checkpoint there"
    ):
        autoplan.runtime.checkpoint.load(tmp_path / "nowhere", Transformer(tiny(2)))
    model = Transformer(tiny(2))
    autoplan.runtime.checkpoint.save(tmp_path / "weights", model)
    with pytest.raises(
        autoplan.runtime.checkpoint.CheckpointMismatch, match=r"holds no optimizer state"
    ):
        autoplan.runtime.checkpoint.load(
            tmp_path / "weights", model, torch.optim.AdamW(model.parameters())
        )
