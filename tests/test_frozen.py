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
from autoplan.cost.price import GRAD_SLOT, price
from autoplan.result.plan import Plan
from autoplan.rewrite import rewrite
from autoplan.runtime.apply import parallelize, shard_inputs
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint
from tests.helpers.gloo import run_workers
from tests.helpers.planning import plan_model

WORLD, MESH, AXES = 4, (2, 2), ("dp", "tp")
STEPS, LR, VOCAB = 3, 1e-2, 32
RTOL, ATOL = 1e-4, 1e-5


def _issue_model() -> nn.Sequential:
    """The issue's example: the first layer's weight frozen."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    model[0].weight.requires_grad_(False)
    return model


class Adapted(nn.Module):
    """A frozen base under a trainable head: the input layer's weight frozen, the middle
    layer frozen whole (the gradient still flows through it), a buffer scaling."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Linear(32, 32)
        self.out = nn.Linear(32, 16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 32))
        self.inp.weight.requires_grad_(False)
        self.mid.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x)) * self.scale
        return self.out(torch.relu(self.mid(h)))


class TiedFrozen(nn.Module):
    """A frozen embedding tied to the output head, one trainable layer between."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.embed.weight.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(ids))))


MODELS = {
    "adapted": (Adapted, lambda: torch.randn(8, 4, 16)),
    "tied": (TiedFrozen, lambda: torch.randint(0, VOCAB, (8, 4))),
}
# the frozen weights sharded, so the forward gathers or computes on shards of them
PINS = {
    "adapted": {"inp.weight": "S(0)S(1)", "mid.weight": "RS(0)"},
    "tied": {"embed.weight": "RS(0)"},  # vocabulary split on tp, lookup and head alike
}


@pytest.mark.parametrize("mm_mode", ["einsum", "native"])
def test_frozen_weight_is_planned_in_both_mm_modes(mm_mode):
    """The issue's model plans in either mm mode and its frozen weight gets a placement."""
    plan = autoplan.plan(
        _issue_model(),
        lambda: torch.randn(8, 16),
        autoplan.fake_mesh(MESH, AXES),
        config=autoplan.PlanConfig(mm_mode=mm_mode),
    )
    assert plan.status == "optimal"
    assert set(plan.param_placements) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert len(plan.param_placements["0.weight"]) == len(MESH)


@pytest.mark.parametrize("mm_mode", ["einsum", "native"])
def test_frozen_weight_counts_no_gradient_or_optimizer_state(mm_mode):
    """Freezing a weight placed S(0)S(0) saves its gradient and two AdamW states per device
    and nothing else: 3 x (32 x 16 / 4) float32 elements."""
    pins = {"0.weight": "S(0)S(0)", "0.bias": "RR", "2.weight": "RR", "2.bias": "RR"}

    def planned(model: nn.Module) -> Plan:
        return autoplan.plan(
            model,
            lambda: torch.randn(8, 16),
            autoplan.fake_mesh(MESH, AXES),
            config=autoplan.PlanConfig(mm_mode=mm_mode, optimizer_states=2),
            pins=pins,
        )

    trainable = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    frozen, shard = planned(_issue_model()), 32 * 16 // WORLD * 4
    trained = planned(trainable)
    assert frozen.memory_bytes == trained.memory_bytes - 3 * shard
    saved = {
        k: trained.memory_breakdown[k] - frozen.memory_breakdown[k]
        for k in ("parameters", "gradients", "optimizer")
    }
    assert saved == {"parameters": 0, "gradients": shard, "optimizer": 2 * shard}


def test_frozen_parameters_have_no_gradient_and_no_gradient_move():
    """A module frozen whole and a frozen weight beside trainable layers: the graph gives
    them no gradient and the cost model no gradient edge (no reduction to price or run),
    while the plan places them."""
    traced, _ = rewrite(trace_joint(Adapted(), MODELS["adapted"][1]), mm_mode="einsum")
    assert traced.frozen == ("inp.weight", "mid.weight", "mid.bias")
    assert set(traced.grads) == {"inp.bias", "out.weight", "out.bias"}
    table = enumerate_strategies(traced, autoplan.fake_mesh(MESH, AXES), mm_mode="einsum")
    costs = price(table, traced, autoplan.Topology())
    node = dict(zip(traced.param_fqns, traced.params, strict=True))
    assert {e.dst for e in costs.edges if e.slot == GRAD_SLOT} == {
        node[f] for f in ("inp.bias", "out.weight", "out.bias")
    }
    plan = plan_model(
        *MODELS["adapted"],
        autoplan.fake_mesh(MESH, AXES),
        input_placements="S(0)R",
        pins=PINS["adapted"],
        mm_mode="einsum",
    )
    assert set(plan.param_placements) == set(traced.param_fqns)
    assert fmt(plan.param_placements["inp.weight"]) == "S(0)S(1)"


def test_no_trainable_parameter_is_a_plan_error():
    """A model with every parameter frozen is a PlanError naming the count and the fix."""
    model = _issue_model().requires_grad_(False)
    with pytest.raises(
        autoplan.PlanError,
        match=r"Sequential has no trainable parameters.*its 4 parameters.*requires_grad_\(True\)",
    ):
        autoplan.plan(model, lambda: torch.randn(8, 16), autoplan.fake_mesh(MESH, AXES))


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
