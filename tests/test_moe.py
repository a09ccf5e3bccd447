"""The mixture-of-experts model: its routing against a token-by-token reference, its
planning (experts placed by the ILP) and an expert-parallel plan run on 4 gloo processes
against one device."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.core.errors import PlanError
from autoplan.core.placements import fmt
from autoplan.models.moe import MoEArgs, MoEFeedForward, MoETransformer, mixtral_8x7b, tiny_moe
from autoplan.result.plan import Plan
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs
from tests.helpers.gloo import run_workers


@torch.no_grad()
def _routing_reference(ffn: MoEFeedForward, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch and combine placed token by token: choices in order of rank, then of
    position; an expert full at ``capacity`` drops the token."""
    args = ffn.args
    groups, group, _ = x.shape
    capacity = args.capacity(group)
    scores = ffn.router(x).float()
    scores = scores.softmax(-1) if args.score == "softmax" else scores.sigmoid()
    top, chosen = scores.topk(args.top_k, dim=-1)
    if args.norm_topk:
        top = top / top.sum(-1, keepdim=True)
    dispatch = torch.zeros(groups, group, args.n_experts, capacity)
    combine = torch.zeros_like(dispatch)
    for g in range(groups):
        filled = [0] * args.n_experts
        for k in range(args.top_k):
            for s in range(group):
                e = int(chosen[g, s, k])
                if filled[e] < capacity:
                    dispatch[g, s, e, filled[e]] = 1.0
                    combine[g, s, e, filled[e]] = float(top[g, s, k])
                    filled[e] += 1
    return dispatch, combine


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_routing_places_tokens_as_a_token_by_token_reference_does(score):
    args = dataclasses.replace(tiny_moe(), score=score, capacity_factor=0.5, n_experts=4)
    torch.manual_seed(0)
    ffn = MoEFeedForward(args)
    x = torch.randn(3, 16, args.dim)
    dispatch, combine = ffn.routing(x)
    want_dispatch, want_combine = _routing_reference(ffn, x)
    assert torch.equal(dispatch, want_dispatch)
    torch.testing.assert_close(combine, want_combine)
    placed = int(dispatch.sum())
    assert 0 < placed < 3 * 16 * args.top_k, "some choices are dropped at this capacity"
    assert (dispatch.sum((1,)) <= 1).all(), "one token per slot"


def test_with_room_for_every_token_the_layer_is_each_tokens_weighted_experts():
    """Nothing dropped: each token's output is the sum over its top-k experts of the
    score times that expert's SwiGLU, plus the shared expert's."""
    args = dataclasses.replace(tiny_moe(), capacity_factor=8.0)
    torch.manual_seed(1)
    ffn = MoEFeedForward(args)
    for p in ffn.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 8, args.dim)
    out = ffn(x)
    scores = ffn.router(x).float().softmax(-1)
    top, chosen = scores.topk(args.top_k, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    w1, w2, w3 = ffn.experts.w1, ffn.experts.w2, ffn.experts.w3
    want = ffn.shared(x)
    for b in range(2):
        for s in range(8):
            t = x[b, s]
            for k in range(args.top_k):
                e = int(chosen[b, s, k])
                h = torch.nn.functional.silu(t @ w1[e]) * (t @ w3[e])
                want[b, s] = want[b, s] + top[b, s, k] * (h @ w2[e])
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def test_groups_route_apart_and_a_sequence_must_split_into_them():
    args = dataclasses.replace(tiny_moe(), group_size=8)
    assert args.group(32) == 8 and args.group(4) == 4
    assert args.capacity(8) == math.ceil(1.25 * 2 * 8 / 4)
    with pytest.raises(PlanError, match="does not split into groups of group_size"):
        args.group(12)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"top_k": 5}, "top_k (5) must be at most n_experts (4)"),
        ({"score": "relu"}, "score ('relu') must be one of softmax, sigmoid"),
        ({"n_experts": 0}, "n_experts (0) must be a positive integer"),
        ({"capacity_factor": 0.0}, "capacity_factor (0.0) must be positive"),
        ({"dim": 66}, "or give head_dim"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        MoEArgs(**(dataclasses.asdict(tiny_moe()) | {"head_dim": 0} | change))


def test_on_mixtral_dims_the_planner_shards_the_experts_by_expert():
    """Mixtral-8x7B's two first layers on 8x8: the ILP puts each expert's weights on its
    own ranks of an axis (Shard on the expert dim), the dispatch an all-to-all."""
    with torch.device("meta"):
        model = MoETransformer(mixtral_8x7b(n_layers=2))
    plan = autoplan.plan(
        model,
        lambda: torch.randint(0, 32000, (16, 4096)),
        autoplan.fake_mesh((8, 8), ("dp", "ep")),
        input_placements=["S(0)R"],
        config=autoplan.PlanConfig(param_dtype="bfloat16", reduce_dtype="float32"),
    )
    assert plan.status == "optimal", plan.message
    experts = [p for fqn, p in plan.param_placements.items() if ".experts." in fqn]
    assert len(experts) == 6
    for placements in experts:
        assert any(fmt((p,)) == "S(0)" for p in placements), fmt(placements)
    assert plan.comm.get("all_to_all", {}).get("count", 0) > 0


WORLD = 4
EP_PINS = {
    f"layers.{i}.feed_forward.experts.{w}": "RS(0)" for i in range(2) for w in ("w1", "w2", "w3")
}


def _expert_parallel_step(rank: int, text: str) -> dict:
    """One forward and backward of the plan on this rank and of the same model on one
    device: the placements, both losses and each gradient's largest relative error."""
    plan = Plan.from_json(text)
    mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
    model = MoETransformer(tiny_moe())
    model.init_weights(seed=0)
    x = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    ref = MoETransformer(tiny_moe())
    ref.load_state_dict(model.state_dict())
    ref_loss = ref(x).float().pow(2).mean()
    ref_loss.backward()
    pmodel = parallelize(model, plan, mesh)
    (local,) = shard_inputs(x, plan, mesh)
    loss = pmodel(local).float().pow(2).mean()
    loss.backward()
    want = dict(ref.named_parameters())
    errors = {
        n: float((g - want[n].grad).abs().max() / want[n].grad.abs().max().clamp_min(1e-12))
        for n, g in full_gradients(pmodel).items()
    }
    return {
        "placed": {n: fmt(p.placements) for n, p in pmodel.named_parameters()},
        "loss": [float(loss.full_tensor()), float(ref_loss)],
        "grads": errors,
    }


def test_an_expert_parallel_plan_runs_on_four_processes_as_on_one_device(tmp_path):
    """The tiny MoE on (dp=2, ep=2) with each layer's experts split over ep: the loss and
    every gradient match one device."""
    with torch.device("meta"):
        model = MoETransformer(tiny_moe())
    plan = autoplan.plan(
        model,
        lambda: torch.randint(0, 128, (4, 16)),
        autoplan.fake_mesh((2, 2), ("dp", "ep")),
        input_placements=["S(0)R"],
        pins=EP_PINS,
        config=autoplan.PlanConfig(solver="highs"),
    )
    assert plan.status == "optimal", plan.message
    result = run_workers(_expert_parallel_step, WORLD, str(tmp_path), plan.to_json())[0]
    assert {fqn: result["placed"][fqn] for fqn in EP_PINS} == EP_PINS
    assert len(result["grads"]) == len(list(model.parameters()))
    got, want = result["loss"]
    assert got == pytest.approx(want, rel=1e-5)
    worst = max(result["grads"].values())
    assert worst < 1e-4, {n: e for n, e in result["grads"].items() if e >= 1e-4}
