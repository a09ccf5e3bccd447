"""The mixture-of-experts model: its routing against a token-by-token reference, the layer
against a per-token sum of its experts, and its arguments checked."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.models.moe import MoEArgs, MoEFeedForward, tiny_moe


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
        ({"aux_loss_coef": -0.1}, "aux_loss_coef (-0.1) must be 0 or more"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        MoEArgs(**(dataclasses.asdict(tiny_moe()) | {"head_dim": 0} | change))


def test_the_balance_loss_reaches_the_router_and_leaves_the_output_alone():
    """aux_loss_coef c: the layer's output is unchanged, and the router's gradient is that of
    the step's loss plus c x the balance loss (which is 1 when routing is even)."""
    args = tiny_moe()
    torch.manual_seed(0)
    layer = MoEFeedForward(dataclasses.replace(args, aux_loss_coef=0.3))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.1)
    plain = MoEFeedForward(args)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    assert torch.equal(out, plain(x))
    out.pow(2).sum().backward()
    (plain(x).pow(2).sum() + 0.3 * plain.balance_loss(x)).backward()
    torch.testing.assert_close(layer.router.weight.grad, plain.router.weight.grad)
    alone = MoEFeedForward(args)
    alone.load_state_dict(plain.state_dict())
    alone(x).pow(2).sum().backward()
    assert not torch.allclose(alone.router.weight.grad, plain.router.weight.grad)
    even = MoEFeedForward(args)
    nn.init.zeros_(even.router.weight)
    assert float(even.balance_loss(x)) == pytest.approx(1.0)
