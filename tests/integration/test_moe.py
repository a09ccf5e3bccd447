"""The mixture-of-experts models planned and run: the experts placed by the ILP on
Mixtral's dimensions (the reference model and transformers' Mixtral), and an
expert-parallel plan on 4 gloo processes against one device."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import autoplan
from autoplan.core.placements import fmt
from autoplan.models import hf
from autoplan.models.moe import MoEArgs, MoETransformer, mixtral_8x7b, tiny_moe
from autoplan.result.plan import Plan
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs
from autoplan.runtime.execute import collective_counts
from autoplan.runtime.lower import CommCounter
from tests.helpers.apply_plans import square_loss
from tests.helpers.gloo import run_workers


def _reference_mixtral() -> torch.nn.Module:
    with torch.device("meta"):
        return MoETransformer(mixtral_8x7b(n_layers=2))


def _hugging_face_mixtral() -> torch.nn.Module:
    pytest.importorskip("transformers")
    config = {
        "num_hidden_layers": 2, "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "num_local_experts": 8, "num_experts_per_tok": 2, "group_size": 1024,
    }  # fmt: skip
    return hf.build_hf("mixtral", config)


@pytest.mark.parametrize(
    "build, expert_weights",
    [(_reference_mixtral, 6), (_hugging_face_mixtral, 4)],
    ids=["reference", "hugging_face"],
)
def test_on_mixtral_dims_the_planner_shards_the_experts_by_expert(build, expert_weights):
    """Mixtral-8x7B's two first layers on 8x8, as the reference model and as transformers'
    Mixtral (its capacity-form experts, hf_experts): the ILP puts each expert's weights on
    its own ranks of an axis (Shard on the expert dim), the dispatch an all-to-all, and
    every op has a sharding rule."""
    plan = autoplan.plan(
        build(),
        lambda: torch.randint(0, 32000, (16, 4096)),
        autoplan.fake_mesh((8, 8), ("dp", "ep")),
        input_placements=["S(0)R"],
        config=autoplan.PlanConfig(param_dtype="bfloat16", reduce_dtype="float32"),
    )
    assert plan.status == "optimal", plan.message
    experts = [p for fqn, p in plan.param_placements.items() if ".experts." in fqn]
    assert len(experts) == expert_weights
    for placements in experts:
        assert any(fmt((p,)) == "S(0)" for p in placements), fmt(placements)
    assert plan.comm.get("all_to_all", {}).get("count", 0) > 0
    assert not plan.fallback_ops, plan.fallback_ops


WORLD = 4


def _balanced() -> MoEArgs:
    """The tiny MoE with its load-balancing loss on: the run checks that path too."""
    return dataclasses.replace(tiny_moe(), aux_loss_coef=0.01)


EP_PINS = {
    f"layers.{i}.feed_forward.experts.{w}": "RS(0)" for i in range(2) for w in ("w1", "w2", "w3")
}


def _expert_parallel_step(rank: int, text: str) -> dict:
    """One step of the plan (the loss planned inside) on this rank, counting the
    collectives it runs, then one AdamW step, and the same on one device: the placements,
    both losses, each gradient's and each updated weight's largest relative error."""
    plan = Plan.from_json(text)
    mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
    model = MoETransformer(_balanced())
    model.init_weights(seed=0)
    x = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    ref = MoETransformer(_balanced())
    ref.load_state_dict(model.state_dict())
    ref_loss = square_loss(ref(x))
    ref_loss.backward()
    torch.optim.AdamW(ref.parameters(), lr=1e-2).step()
    pmodel = parallelize(model, plan, mesh, loss_fn=square_loss)
    (local,) = shard_inputs(x, plan, mesh)
    pmodel(local).backward()  # the first call traces
    pmodel.zero_grad()
    with CommCounter() as comm:
        loss = pmodel(local)
        loss.backward()
    grads = full_gradients(pmodel)
    torch.optim.AdamW(pmodel.parameters(), lr=1e-2).step()
    want = dict(ref.named_parameters())
    return {
        "placed": {n: fmt(p.placements) for n, p in pmodel.named_parameters()},
        "loss": [float(_full(loss)), float(ref_loss.detach())],
        "grads": {n: _relative(g, want[n].grad) for n, g in grads.items()},
        "adamw": {n: _relative(p.full_tensor().detach(), want[n].detach())
                  for n, p in pmodel.named_parameters()},
        "collectives": collective_counts(comm.get_comm_counts()),
    }  # fmt: skip


def _full(loss: torch.Tensor) -> torch.Tensor:
    return (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def test_an_expert_parallel_plan_runs_on_four_processes_as_on_one_device(tmp_path):
    """The tiny MoE with its load-balancing loss on (dp=2, ep=2), each layer's experts split
    over ep and run on their own ranks (the tokens, replicated over ep, reach them with no
    move; their outputs are gathered back, the dispatch the ILP picks at this size over an
    all-to-all): the loss, every gradient (the router's carry the balance loss's) and the
    weights after one AdamW step match one device, and the step runs the collectives the
    plan priced, kind by kind."""
    with torch.device("meta"):
        model = MoETransformer(_balanced())
    plan = autoplan.plan(
        model,
        lambda: torch.randint(0, 128, (4, 16)),
        autoplan.fake_mesh((2, 2), ("dp", "ep")),
        input_placements=["S(0)R"],
        pins=EP_PINS,
        loss_fn=square_loss,
        config=autoplan.PlanConfig(solver="highs"),
    )
    assert plan.status == "optimal", plan.message
    result = run_workers(_expert_parallel_step, WORLD, str(tmp_path), plan.to_json())[0]
    assert {fqn: result["placed"][fqn] for fqn in EP_PINS} == EP_PINS
    assert result["collectives"] == plan.collective_counts()
    assert len(result["grads"]) == len(list(model.parameters()))
    got, want = result["loss"]
    assert got == pytest.approx(want, rel=1e-5)
    worst = max(result["grads"].values())
    assert worst < 1e-4, {n: e for n, e in result["grads"].items() if e >= 1e-4}
    worst = max(result["adamw"].values())
    assert worst < 1e-4, {n: e for n, e in result["adamw"].items() if e >= 1e-4}
