"""A mixture-of-experts decoder, written in the capacity-based einsum form, for autoplan.

The blocks are LLaMA-3's (:mod:`autoplan.models.llama3`: RMSNorm, RoPE, grouped-query
attention) with the feed-forward replaced by routed experts: a router scores each token
against ``n_experts`` experts (softmax or sigmoid), each token goes to its ``top_k``
best, and optional shared experts see every token.

Why the capacity form (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021): every
shape is static, so the model traces on fake tensors and each step is an einsum or a
pointwise op that DTensor has rules for. Tokens are routed in groups of ``group_size``
(GShard); each expert takes at most ``capacity`` tokens of a group (``capacity_factor``
times its fair share); a token over capacity skips
that expert (its residual carries it). Dispatch and combine are einsums with a one-hot
``[batch, seq, expert, capacity]`` mask, and the experts are one batched einsum over the
expert dimension, so expert parallelism is ``Shard`` on that dimension of the expert
weights and of the dispatched tokens, and the dispatch a move from batch-sharded to
expert-sharded tokens (an all-to-all) that the planner prices and chooses like any other.

``aux_loss_coef`` adds Switch's load-balancing loss through the backward (the forward
returns the logits alone). Not in this model: a dropless (grouped-matmul) dispatch and
Qwen3's per-head q/k norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.models.llama3 import Decoder, DecoderBlock, DecoderShape, FeedForward, _generator

SCORES = ("softmax", "sigmoid")


@dataclass
class MoEArgs(DecoderShape):
    """Shape of a mixture-of-experts decoder; see :func:`mixtral_8x7b`, :func:`qwen3_30b_a3b`.
    The attention side (:class:`~autoplan.models.llama3.DecoderShape`) is LLaMA-3's."""

    vocab_size: int = 32000
    rope_theta: float = 1000000.0
    max_seq_len: int = 4096
    head_dim: int = 0
    """Channels per head; 0 means ``dim // n_heads`` (resolved when the arguments are made)."""
    n_experts: int = 8
    """Routed experts per layer."""
    top_k: int = 2
    """Experts each token is sent to."""
    expert_dim: int = 14336
    """Hidden size of each expert's SwiGLU."""
    n_shared_experts: int = 0
    """Experts every token goes through (one SwiGLU of ``n_shared_experts * expert_dim``)."""
    score: str = "softmax"
    """How the router scores experts: ``softmax`` over experts, or ``sigmoid`` per expert."""
    norm_topk: bool = True
    """Rescale each token's top-k scores to sum to 1 (Mixtral, Qwen3-MoE)."""
    capacity_factor: float = 1.25
    """Each expert takes ``capacity_factor * top_k * group / n_experts`` tokens of a group."""
    group_size: int = 1024
    """Tokens routed together (GShard's groups): a sequence is cut into groups of this many
    (the whole sequence when shorter). The dispatch mask holds ``group * experts *
    capacity`` values per group, so it grows with the group, not with the sequence."""
    aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss (Switch, Fedus et al. 2021) each layer adds to the
    training loss: ``n_experts`` x the sum over experts of (its share of the top-k choices)
    x (its mean router score), which is 1 when routing is even. The forward still returns
    the logits alone; the loss enters through the backward (its gradient reaches the
    router). 0: none."""

    def __post_init__(self) -> None:
        self._check_shape("n_experts", "top_k", "expert_dim", "group_size")
        if self.n_shared_experts < 0:
            raise PlanError(f"n_shared_experts ({self.n_shared_experts}) must be 0 or more.")
        if self.top_k > self.n_experts:
            raise PlanError(
                f"top_k ({self.top_k}) must be at most n_experts ({self.n_experts}): a token "
                "goes to top_k distinct experts."
            )
        if self.score not in SCORES:
            raise PlanError(f"score ({self.score!r}) must be one of {', '.join(SCORES)}.")
        if self.capacity_factor <= 0:
            raise PlanError(f"capacity_factor ({self.capacity_factor}) must be positive.")
        if not self.aux_loss_coef >= 0:
            raise PlanError(f"aux_loss_coef ({self.aux_loss_coef}) must be 0 or more.")
        if self.head_dim < 0:
            raise PlanError(
                f"head_dim ({self.head_dim}) must be positive, or 0 for dim // n_heads."
            )
        if self.head_dim == 0:
            if self.dim % self.n_heads != 0:
                raise PlanError(
                    f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}), "
                    "or give head_dim."
                )
            self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2 != 0:
            raise PlanError(f"head_dim ({self.head_dim}) must be even: RoPE rotates pairs.")

    def group(self, seq: int) -> int:
        """Tokens per routing group for sequences of ``seq`` tokens."""
        group = routing_group(self.group_size, seq)
        if group is None:
            raise PlanError(
                f"a sequence of {seq} tokens does not split into groups of group_size "
                f"({self.group_size}); give a seq that is a multiple of it, or another group_size."
            )
        return group

    def capacity(self, group: int) -> int:
        """Tokens of one group each expert takes at most."""
        return expert_capacity(self.capacity_factor, self.top_k, group, self.n_experts)


def mixtral_8x7b(n_layers: int = 32) -> MoEArgs:
    """Mixtral-8x7B (Jiang et al. 2024); fewer ``n_layers`` for a shallower model."""
    return MoEArgs(
        dim=4096, n_layers=n_layers, n_heads=32, n_kv_heads=8, vocab_size=32000,
        n_experts=8, top_k=2, expert_dim=14336, rope_theta=1000000.0, max_seq_len=32768,
    )  # fmt: skip


def qwen3_30b_a3b(n_layers: int = 48) -> MoEArgs:
    """Qwen3-30B-A3B; fewer ``n_layers`` for a shallower model."""
    return MoEArgs(
        dim=2048, n_layers=n_layers, n_heads=32, n_kv_heads=4, head_dim=128,
        vocab_size=151936, n_experts=128, top_k=8, expert_dim=768, norm_eps=1e-6,
        rope_theta=1000000.0, max_seq_len=40960,
    )  # fmt: skip


def tiny_moe(n_layers: int = 2) -> MoEArgs:
    """A small MoE for tests on the CPU: 4 experts, top-2, one shared expert."""
    return MoEArgs(
        dim=64, n_layers=n_layers, n_heads=4, n_kv_heads=2, vocab_size=128, n_experts=4,
        top_k=2, expert_dim=64, n_shared_experts=1, max_seq_len=32,
    )  # fmt: skip


class Experts(nn.Module):
    """``n_experts`` SwiGLU experts as three ``[experts, ...]`` weights, run as one einsum
    each over the expert dimension."""

    def __init__(self, n_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [batch, experts, capacity, dim]`` -> the same shape."""
        gate = F.silu(torch.einsum("becd,edh->bech", x, self.w1))
        up = torch.einsum("becd,edh->bech", x, self.w3)
        return torch.einsum("bech,ehd->becd", gate * up, self.w2)


def routing_group(size: int, tokens: int) -> int | None:
    """Tokens per routing group of ``tokens`` tokens: ``size``, or all of them when fewer;
    None when they do not split into such groups (the caller says how to fix it)."""
    group = min(size, tokens)
    return group if size >= 1 and tokens % group == 0 else None


def expert_capacity(factor: float, top_k: int, group: int, n_experts: int) -> int:
    """Tokens of a group of ``group`` each expert takes at most: ``factor`` times its fair
    share of the group's ``top_k`` choices, at least one."""
    return max(1, math.ceil(factor * top_k * group / n_experts))


def dispatch_masks(
    chosen: torch.Tensor, top: torch.Tensor, n_experts: int, capacity: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dispatch, combine), each ``[groups, group, expert, capacity]`` in ``dtype``, from each
    token's ``chosen`` experts and their scores ``top`` (both ``[groups, group, k]``):
    dispatch is 1 where a token takes a slot of an expert, combine that times the token's
    score for the expert. Slots go in order of choice, then of position: every token's first
    choice is placed before any token's second (GShard); a token past an expert's
    ``capacity`` skips it. Only the scores carry a gradient: the slots are chosen without
    one, so the backward keeps the mask and ``[groups, group, expert]`` scores."""
    groups, group, k = chosen.shape
    experts = torch.arange(n_experts, device=chosen.device)
    onehot = (chosen[..., None] == experts).float()  # [groups, group, k, expert]
    gates = (onehot * top[..., None]).sum(2)  # each token's score per expert it chose
    with torch.no_grad():
        by_choice = onehot.transpose(1, 2).reshape(groups, k * group, -1)
        position = by_choice.cumsum(1).reshape(groups, k, group, -1).transpose(1, 2)
        kept = onehot * (position <= capacity).float()  # position counts from 1
        slot = (kept * position).sum(2) - 1.0  # [groups, group, expert]; -1: not placed
        slots = torch.arange(capacity, device=chosen.device)
        dispatch = (slot[..., None] == slots).to(dtype)
    combine = dispatch * gates[..., None].to(dtype)
    return dispatch, combine


class MoEFeedForward(nn.Module):
    """Router, capacity dispatch, experts, combine (see the module docstring)."""

    def __init__(self, args: MoEArgs) -> None:
        super().__init__()
        self.args = args
        self.router = nn.Linear(args.dim, args.n_experts, bias=False)
        self.experts = Experts(args.n_experts, args.dim, args.expert_dim)
        hidden = args.n_shared_experts * args.expert_dim
        # the shared experts: one SwiGLU every token goes through beside the routed ones
        self.shared = FeedForward(args.dim, hidden) if args.n_shared_experts else None

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """``x [groups, group, dim]`` -> the router's score of every expert for every token."""
        logits = self.router(x).float()
        return logits.softmax(-1) if self.args.score == "softmax" else logits.sigmoid()

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [groups, group, dim]`` -> (dispatch, combine) of :func:`dispatch_masks`, from
        the router's scores of each token's ``top_k`` experts."""
        dispatch, combine, _ = self._dispatch(self.scores(x), x.shape[1], x.dtype)
        return dispatch, combine

    def balance_loss(self, x: torch.Tensor) -> torch.Tensor:
        """The load-balancing loss of ``x [groups, group, dim]`` (see ``MoEArgs.aux_loss_coef``),
        averaged over the groups; only the mean scores carry a gradient."""
        scores = self.scores(x)
        return self._balance(scores, scores.topk(self.args.top_k, dim=-1).indices)

    def _dispatch(
        self, scores: torch.Tensor, group: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dispatch, combine, chosen experts ``[groups, group, k]``) from the scores."""
        args = self.args
        top, chosen = scores.topk(args.top_k, dim=-1)
        if args.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        dispatch, combine = dispatch_masks(chosen, top, args.n_experts, args.capacity(group), dtype)
        return dispatch, combine, chosen

    def _balance(self, scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        experts = torch.arange(self.args.n_experts, device=scores.device)
        with torch.no_grad():
            share = (chosen[..., None] == experts).float().mean((1, 2))  # [groups, expert]
        return self.args.n_experts * (share * scores.mean(1)).sum(-1).mean()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        group = self.args.group(seq)
        tokens = x.reshape(batch * (seq // group), group, dim)
        scores = self.scores(tokens)  # once: the balance loss reads the routing's scores
        dispatch, combine, chosen = self._dispatch(scores, group, x.dtype)
        routed = torch.einsum("bsec,bsd->becd", dispatch, tokens)
        out = torch.einsum("bsec,becd->bsd", combine, self.experts(routed)).reshape(x.shape)
        if self.shared is not None:
            out = out + self.shared(x)
        if self.args.aux_loss_coef > 0:
            extra = self.args.aux_loss_coef * self._balance(scores, chosen)
            out = _AddToLoss.apply(out, extra)
        return out


class _AddToLoss(torch.autograd.Function):
    """Pass ``out`` on unchanged and add ``extra`` to whatever loss the step computes from
    it: the backward gives ``extra`` a gradient of 1 (Megatron's and DeepSpeed's way of
    training an auxiliary loss when the forward returns the logits alone)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        ctx.extra = (extra.shape, extra.dtype)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape, dtype = ctx.extra
        return grad, torch.ones(shape, dtype=dtype, device=grad.device)


class MoEBlock(DecoderBlock):
    """Pre-norm block: attention, then the mixture of experts, each added to the residual."""

    def __init__(self, args: MoEArgs) -> None:
        super().__init__(args, lambda: MoEFeedForward(args))


class MoETransformer(Decoder):
    """Mixture-of-experts language model: token ids ``[B, S]`` to logits ``[B, S, vocab]``."""

    args: MoEArgs

    def __init__(self, args: MoEArgs) -> None:
        super().__init__(args, lambda: MoEBlock(args))

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Fill the RoPE tables and draw every weight from N(0, 0.02) (norms: ones), the
        experts' included; the same ``seed`` gives the same weights. Use after
        ``to_empty(device=...)``."""
        self.init_buffers()
        generator = _generator(self.freqs_cos.device, seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=0.02, generator=generator)
