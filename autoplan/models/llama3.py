"""LLaMA-3 decoder-only transformer, written from scratch as a model for autoplan to plan.

autoplan needs a realistic model to search shardings for, and LLaMA-3 is the common
benchmark. This version is written so that the planner can work with it:

- it builds under ``with torch.device("meta")`` without allocating memory, so the planner
  can trace LLaMA3-70B without holding its weights; ``to_empty`` + ``init_weights`` then
  make it real;
- RoPE uses real cos/sin tables rather than complex numbers, because the sharding rules
  do not cover complex ops;
- nothing depends on the device or branches on tensor values, so the traced graph is
  the same for every input.

Parameter names follow Meta's reference (``layers.0.attention.wq.weight``, ...), so
plans and checkpoints written for that code also work here.
Reference: https://github.com/meta-llama/llama3/blob/main/llama/model.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.core.errors import PlanError


def ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """SwiGLU hidden size, computed the way Meta's llama3 ``FeedForward`` does.

    Start from 4 * dim, scale by 2/3 so that SwiGLU's three matrices cost about as much as
    a plain MLP's two (Shazeer 2020, "GLU Variants Improve Transformer"), apply the
    optional multiplier, then round up to a multiple of ``multiple_of``.
    """
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class DecoderShape:
    """The attention side of a decoder's arguments: what :class:`ModelArgs` and
    :class:`autoplan.models.moe.MoEArgs` share. Defaults follow Meta's LLaMA-3."""

    dim: int = 4096
    """Width of the residual stream."""
    n_layers: int = 32
    """Number of transformer blocks."""
    n_heads: int = 32
    """Number of query heads."""
    n_kv_heads: int | None = None
    """Number of key/value heads (grouped-query attention); ``None`` means ``n_heads``."""
    vocab_size: int = 128256
    """Number of token ids."""
    norm_eps: float = 1e-5
    """Epsilon inside RMSNorm's square root."""
    rope_theta: float = 500000.0
    """Base of the RoPE frequencies."""
    max_seq_len: int = 8192
    """Longest sequence the RoPE tables cover."""

    def _check_shape(self, *positive: str) -> None:
        """Raise a PlanError for a field out of range: the shared ones and ``positive``."""
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len", *positive):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"{name} ({value!r}) must be a positive integer.")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if value <= 0:
                raise PlanError(f"{name} ({value}) must be positive.")
        if self.n_kv_heads is not None and self.n_kv_heads <= 0:
            raise PlanError(f"n_kv_heads ({self.n_kv_heads}) must be positive or None.")
        if self.n_heads % self.kv_heads != 0:
            raise PlanError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads})."
            )

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads, with ``None`` resolved to ``n_heads``."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclass
class ModelArgs(DecoderShape):
    """Shape of a LLaMA-3 model. Defaults follow Meta's ``ModelArgs``; see :func:`llama3_8b`."""

    multiple_of: int = 256
    """The FFN hidden size is rounded up to a multiple of this."""
    ffn_dim_multiplier: float | None = None
    """Optional scale on the FFN hidden size, applied before rounding."""

    def __post_init__(self) -> None:
        self._check_shape("multiple_of")
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise PlanError(
                f"ffn_dim_multiplier ({self.ffn_dim_multiplier}) must be positive or None."
            )
        if self.dim % self.n_heads != 0:
            raise PlanError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}).")
        if self.head_dim % 2 != 0:
            raise PlanError(
                f"head_dim ({self.head_dim}) = dim / n_heads must be even, "
                "because RoPE rotates pairs of channels."
            )

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """SwiGLU hidden size; see :func:`ffn_hidden_dim`."""
        return ffn_hidden_dim(self.dim, self.multiple_of, self.ffn_dim_multiplier)


def llama3_8b(n_layers: int = 32) -> ModelArgs:
    """LLaMA3-8B; pass fewer ``n_layers`` for a shallower model of the same width."""
    return ModelArgs(
        dim=4096,
        n_layers=n_layers,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        multiple_of=1024,
        ffn_dim_multiplier=1.3,
        rope_theta=500000.0,
    )


def llama3_70b(n_layers: int = 80) -> ModelArgs:
    """LLaMA3-70B; pass fewer ``n_layers`` for a shallower model of the same width."""
    return ModelArgs(
        dim=8192,
        n_layers=n_layers,
        n_heads=64,
        n_kv_heads=8,
        vocab_size=128256,
        multiple_of=4096,
        ffn_dim_multiplier=1.3,
        rope_theta=500000.0,
    )


def tiny(n_layers: int = 2) -> ModelArgs:
    """A 115k-parameter model with grouped-query attention, for tests on the CPU."""
    return ModelArgs(
        dim=64,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        multiple_of=32,
        max_seq_len=32,
    )


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos and sin tables, each ``[max_seq_len, head_dim // 2]`` in float32.

    Channel pair ``i`` at position ``t`` is rotated by ``t * theta ** (-2i / head_dim)``
    (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding").
    """
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    positions = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs ``(2i, 2i+1)`` of ``x [B, S, H, D]`` by the angles in ``cos``/``sin``.

    This is Meta's ``x * exp(i * angle)`` on complex pairs, spelled out in real arithmetic
    so that only real view, pointwise and stack ops appear. ``cos``/``sin`` are ``[S, D // 2]``.
    """
    batch, seq, heads, head_dim = x.shape
    pairs = x.float().reshape(batch, seq, heads, head_dim // 2, 2)
    x_even, x_odd = pairs[..., 0], pairs[..., 1]
    cos = cos.view(1, seq, 1, head_dim // 2)
    sin = sin.view(1, seq, 1, head_dim // 2)
    rotated = torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times: ``[B, S, KVH, D] -> [B, S, KVH * n_rep, D]``.

    Equal to ``repeat_interleave(n_rep, dim=2)``, but written as expand + reshape so the
    traced graph holds only view ops.
    """
    batch, seq, kv_heads, head_dim = x.shape
    expanded = x[:, :, :, None, :].expand(batch, seq, kv_heads, n_rep, head_dim)
    return expanded.reshape(batch, seq, kv_heads * n_rep, head_dim)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        """Set the scale back to ones."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class DecoderArgs(Protocol):
    """What the decoder's attention, norms, embeddings and RoPE tables read of a model's
    arguments (:class:`ModelArgs`, :class:`autoplan.models.moe.MoEArgs`)."""

    @property
    def dim(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def norm_eps(self) -> float: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def max_seq_len(self) -> int: ...


class Attention(nn.Module):
    """Causal multi-head attention with grouped-query key/value heads and RoPE."""

    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        k = repeat_kv(k, n_rep)
        v = repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        out = out.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderBlock(nn.Module):
    """Pre-norm block: attention then a feed-forward (``feed_forward()`` makes it, after the
    attention, so a model built on a device draws its weights in this order), each added to
    the residual stream."""

    def __init__(self, args: DecoderArgs, feed_forward: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = feed_forward()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class TransformerBlock(DecoderBlock):
    """LLaMA-3's block: attention then SwiGLU."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args, lambda: FeedForward(args.dim, args.hidden_dim))


class Decoder(nn.Module):
    """A decoder-only language model: token ids ``[B, S]`` to logits ``[B, S, vocab_size]``,
    through ``args.n_layers`` blocks that ``block()`` makes."""

    freqs_cos: torch.Tensor  # buffers (register_buffer), declared for the type checker
    freqs_sin: torch.Tensor

    def __init__(self, args: DecoderArgs, block: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(block() for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Non-persistent: the tables are derived from args, so checkpoints need not hold them.
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the RoPE tables in place, on the device the buffers live on."""
        args = self.args
        cos, sin = rope_tables(
            args.head_dim, args.max_seq_len, args.rope_theta, device=self.freqs_cos.device
        )
        self.freqs_cos.copy_(cos)
        self.freqs_sin.copy_(sin)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Fill the RoPE tables and draw all weights: N(0, 0.02) for linears and embeddings,
        ones for norms. The same ``seed`` gives the same weights.

        Use after ``to_empty(device=...)`` on a model built on the meta device.
        """
        self.init_buffers()
        generator = _generator(self.freqs_cos.device, seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02, generator=generator)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.freqs_cos[:seq], self.freqs_sin[:seq]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


class Transformer(Decoder):
    """LLaMA-3 language model: token ids ``[B, S]`` to logits ``[B, S, vocab_size]``."""

    args: ModelArgs

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args, lambda: TransformerBlock(args))


def _generator(device: torch.device, seed: int | None) -> torch.Generator | None:
    """A generator seeded with ``seed`` for ``device``, or None to use the global RNG.

    Meta tensors hold no data, so any CPU generator will do for them.
    """
    if seed is None:
        return None
    if device.type == "meta":
        device = torch.device("cpu")
    return torch.Generator(device=device).manual_seed(seed)
