"""Frozen parameters (``requires_grad=False``): planned, priced and run like any other
parameter in the forward, with no gradient, no gradient collective and no optimizer state.

The runs go on 4 gloo processes on a 2x2 (dp, tp) mesh: plans are made in this process
on a fake mesh and handed to the children as JSON (a fake process group and a real gloo
group must not share a process); each trains a few AdamW steps against one device.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

import autoplan
from autoplan.core.placements import fmt
from autoplan.result.plan import Plan
from autoplan.runtime.apply import parallelize, shard_inputs
from tests.helpers.frozen_models import AXES, LR, MESH, MODELS, PINS, STEPS, WORLD
from tests.helpers.gloo import run_workers
from tests.helpers.planning import plan_model

RTOL, ATOL = 1e-4, 1e-5


def _steps(model: nn.Module, batches, feed) -> tuple[list[float], torch.optim.Optimizer]:
    """``STEPS`` AdamW steps on the trainable parameters; each step's loss. The last
    step's gradients are kept."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses = []
    for x in batches:
        opt.zero_grad()
        loss = model(feed(x)).float().pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(float(_full(loss).detach()))
    return losses, opt


def _feed(plan: Plan, mesh: DeviceMesh) -> Callable[[torch.Tensor], torch.Tensor]:
    """A global batch to this rank's shard of it, placed as planned."""
    return lambda x: shard_inputs(x, plan, mesh)[0].to_local()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(_full(a).detach(), b.detach(), rtol=RTOL, atol=ATOL))


def _train_case(kind: str, plan: Plan, ckpt: str | None) -> dict:
    """A planned run against one device: losses, trainable weights and last gradients
    equal; frozen weights unchanged, without gradient; then, with ``ckpt``, a save and a
    load into a fresh model that takes the same next step."""
    mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
    build, batch = MODELS[kind]
    torch.manual_seed(0)
    model = build()
    ref = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(1)
    batches = [batch() for _ in range(STEPS + 1)]
    ref_losses, _ = _steps(ref, batches[:STEPS], lambda x: x)
    pmodel = parallelize(model, plan, mesh)
    losses, opt = _steps(pmodel, batches[:STEPS], _feed(plan, mesh))
    ref_params = dict(ref.named_parameters())
    params = dict(pmodel.named_parameters())
    frozen = [n for n, p in params.items() if not p.requires_grad]
    (train,) = [step for key, step in pmodel.autoplan_graphs().items() if key[-1] == "train"]
    result = {
        "losses": [
            abs(a - b) <= ATOL + RTOL * abs(b) for a, b in zip(losses, ref_losses, strict=True)
        ],
        "trained": {n: _close(p, ref_params[n]) for n, p in params.items() if p.requires_grad},
        "grads": {
            n: _close(p.grad, ref_params[n].grad) for n, p in params.items() if p.requires_grad
        },
        "frozen": sorted(frozen),
        "unchanged": {n: bool(torch.equal(_full(params[n]).detach(), before[n])) for n in frozen},
        "frozen_grads": [n for n in frozen if params[n].grad is not None],
        "placed": {n: fmt(params[n].placements) for n in frozen},
        "tied": kind != "tied" or pmodel.head.weight is pmodel.embed.weight,
        "collectives": train.unbucketed_collectives(),
        "deviations": list(train.deviations),
    }
    if ckpt is not None:
        result["checkpoint"] = _checkpoint_case(kind, plan, mesh, pmodel, opt, batches[STEPS], ckpt)
    return result


def _checkpoint_case(
    kind: str,
    plan: Plan,
    mesh: DeviceMesh,
    pmodel: nn.Module,
    opt: torch.optim.Optimizer,
    batch: torch.Tensor,
    ckpt: str,
) -> dict:
    """Save the trained model and optimizer, load them into another parallelized model,
    and take one more step on each: the same loss, the same weights."""
    autoplan.runtime.checkpoint.save(ckpt, pmodel, opt, step=STEPS)
    torch.manual_seed(2)
    other = parallelize(MODELS[kind][0](), plan, mesh)
    other_opt = torch.optim.AdamW([p for p in other.parameters() if p.requires_grad], lr=LR)
    extra = autoplan.runtime.checkpoint.load(ckpt, other, other_opt)
    feed = _feed(plan, mesh)
    losses = []
    for m, o in ((pmodel, opt), (other, other_opt)):
        o.zero_grad()
        loss = m(feed(batch)).float().pow(2).mean()
        loss.backward()
        o.step()
        losses.append(float(loss.full_tensor().detach()))
    mine, theirs = dict(pmodel.named_parameters()), dict(other.named_parameters())
    return {
        "extra": extra,
        "loss": losses[0] == losses[1],
        "weights": {n: bool(torch.equal(_full(p), _full(theirs[n]))) for n, p in mine.items()},
        "frozen": sorted(n for n, p in theirs.items() if not p.requires_grad),
    }


def _cases(rank: int, cases: list[dict]) -> dict:
    return {c["name"]: _train_case(c["kind"], Plan.from_json(c["plan"]), c["ckpt"]) for c in cases}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Plan, dict]]:
    """Each case's plan, made here, and its run on 4 gloo processes (one spawn for all)."""
    tmp = tmp_path_factory.mktemp("frozen")
    cases = [
        {"name": "einsum", "kind": "adapted", "mm_mode": "einsum", "ckpt": str(tmp / "ckpt")},
        {"name": "native", "kind": "adapted", "mm_mode": "native", "ckpt": None},
        {"name": "tied", "kind": "tied", "mm_mode": "einsum", "ckpt": None},
    ]
    plans = {
        c["name"]: plan_model(
            *MODELS[c["kind"]],
            autoplan.fake_mesh(MESH, AXES),
            input_placements="S(0)R",
            pins=PINS[c["kind"]],
            mm_mode=c["mm_mode"],
        )
        for c in cases
    }
    for case in cases:
        case["plan"] = plans[case["name"]].to_json()
    results = run_workers(_cases, WORLD, str(Path(tmp)), cases)[0]
    return {name: (plans[name], r) for name, r in results.items()}


@pytest.mark.parametrize("name", ["einsum", "native", "tied"])
def test_frozen_parameters_train_as_on_one_device(runs, name):
    """On 4 gloo ranks, AdamW steps give one device's losses, trainable weights and
    gradients; frozen weights (a frozen module, a buffer beside, a tied frozen embedding)
    stay as they were, placed as planned, with no gradient; the step runs the collectives
    the plan priced (no gradient reduction for a frozen weight) and no others."""
    plan, r = runs[name]
    assert all(r["losses"]), r["losses"]
    assert all(r["trained"].values()), r["trained"]
    assert all(r["grads"].values()), r["grads"]
    want = ["embed.weight"] if name == "tied" else ["inp.weight", "mid.bias", "mid.weight"]
    assert r["frozen"] == want
    assert all(r["unchanged"].values()), r["unchanged"]
    assert r["frozen_grads"] == []
    assert r["tied"]
    assert r["deviations"] == []
    assert r["collectives"] == plan.collective_counts(bucketed=False)
    assert r["placed"] == {n: fmt(plan.param_placements[n]) for n in want}
    assert PINS["tied" if name == "tied" else "adapted"].items() <= r["placed"].items()


def test_checkpoint_round_trip_keeps_frozen_weights(runs):
    """A checkpoint saved from a model with frozen weights loads into another parallelized
    one (weights and AdamW state), which then takes the same step; they stay frozen."""
    r = runs["einsum"][1]["checkpoint"]
    assert r["extra"] == {"step": STEPS}
    assert r["loss"]
    assert all(r["weights"].values()), r["weights"]
    assert r["frozen"] == ["inp.weight", "mid.bias", "mid.weight"]
