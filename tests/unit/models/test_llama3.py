"""The reference LLaMA-3 (autoplan.models.llama3): shapes, names and numerics against Meta's
and torch's."""

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from autoplan.models import ModelArgs, Transformer
from autoplan.models.llama3 import (
    RMSNorm,
    apply_rotary,
    llama3_8b,
    llama3_70b,
    repeat_kv,
    rope_tables,
    tiny,
)


def _tiny_model(seed: int = 0, **overrides: int) -> Transformer:
    model = Transformer(dataclasses.replace(tiny(), **overrides))
    model.init_weights(seed=seed)
    return model


def _tokens(batch: int = 2, seq: int = 16, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def test_llama3_8b_param_count():
    """LLaMA3-8B built on meta has exactly the parameter count of the published shapes."""
    with torch.device("meta"):
        model = Transformer(llama3_8b())
    dim, kv_dim, hidden, vocab = 4096, 1024, 14336, 128256
    per_layer = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden + 2 * dim
    expected = vocab * dim + 32 * per_layer + dim + dim * vocab
    assert sum(p.numel() for p in model.parameters()) == expected == 8_030_261_248


def test_ffn_hidden_dims_match_meta():
    """The SwiGLU hidden size is 14336 for LLaMA3-8B and 28672 for LLaMA3-70B."""
    assert llama3_8b().hidden_dim == 14336
    assert llama3_70b().hidden_dim == 28672


def test_parameter_names_follow_meta():
    """Parameter FQNs match Meta's checkpoint names."""
    names = set(dict(_tiny_model().named_parameters()))
    for name in (
        "tok_embeddings.weight",
        "layers.0.attention.wq.weight",
        "layers.0.attention.wo.weight",
        "layers.1.feed_forward.w1.weight",
        "layers.1.feed_forward.w3.weight",
        "layers.0.attention_norm.weight",
        "layers.0.ffn_norm.weight",
        "norm.weight",
        "output.weight",
    ):
        assert name in names
    assert "freqs_cos" not in _tiny_model().state_dict()


def test_tiny_forward_backward_finite():
    """A tiny model runs forward and backward on CPU with finite grads on every parameter."""
    model = _tiny_model()
    logits = model(_tokens())
    assert logits.shape == (2, 16, 128)
    logits.float().logsumexp(-1).mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name


def test_causal():
    """Changing a later token leaves the logits of earlier positions unchanged."""
    model = _tiny_model()
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 128
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_full_multi_head_attention():
    """With n_kv_heads == n_heads (no grouping) the model still runs."""
    model = _tiny_model(n_kv_heads=4)
    assert model.layers[0].attention.wk.weight.shape == (64, 64)
    assert torch.isfinite(model(_tokens())).all()


def test_repeat_kv_matches_repeat_interleave():
    """The expand + reshape head repeat equals repeat_interleave on the head dim."""
    x = torch.randn(2, 5, 3, 8)
    torch.testing.assert_close(repeat_kv(x, 4), x.repeat_interleave(4, dim=2))


def test_rotary_matches_complex_reference():
    """Real-valued RoPE equals Meta's complex multiplication by exp(i * angle)."""
    x = torch.randn(2, 7, 3, 16)
    cos, sin = rope_tables(head_dim=16, max_seq_len=7, theta=10000.0)
    x_complex = torch.view_as_complex(x.reshape(2, 7, 3, 8, 2))
    angles = torch.outer(torch.arange(7.0), 10000.0 ** (-torch.arange(0, 16, 2) / 16))
    rotation = torch.polar(torch.ones_like(angles), angles).view(1, 7, 1, 8)
    expected = torch.view_as_real(x_complex * rotation).flatten(-2)
    torch.testing.assert_close(apply_rotary(x, cos, sin), expected)


def test_rmsnorm_matches_torch():
    """The hand-written RMSNorm equals F.rms_norm."""
    norm = RMSNorm(16, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (16,), norm.weight, eps=1e-5))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_kv_heads": 7}, "n_heads (32) must be divisible by n_kv_heads (7)."),
        ({"dim": 4100}, "dim (4100) must be divisible by n_heads (32)."),
        ({"n_layers": 0}, "n_layers (0) must be a positive integer."),
        ({"n_kv_heads": 0}, "n_kv_heads (0) must be positive or None."),
        ({"dim": 96, "n_heads": 32}, "head_dim (3) = dim / n_heads must be even"),
        ({"norm_eps": 0.0}, "norm_eps (0.0) must be positive."),
    ],
)
def test_model_args_validation(overrides, message):
    """Invalid ModelArgs raise ValueError naming the value and the rule."""
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelArgs(**overrides)


def test_meta_build_allocates_nothing():
    """LLaMA3-8B built under the meta device stays on meta, buffers included (its speed is
    a benchmark's, not a test's: a timed assertion fails on a busy machine)."""
    with torch.device("meta"):
        model = Transformer(llama3_8b())
    assert all(p.is_meta for p in model.parameters())
    assert all(b.is_meta for b in model.buffers())
    assert model.freqs_cos.shape == (8192, 64)


def test_to_empty_then_init_weights_is_seeded():
    """A meta-built model made real with to_empty + init_weights is finite and seed-determined."""

    def build(seed: int) -> Transformer:
        with torch.device("meta"):
            model = Transformer(tiny())
        model.to_empty(device="cpu")
        model.init_weights(seed=seed)
        return model

    tokens = _tokens()
    with torch.no_grad():
        first, again, other = build(0)(tokens), build(0)(tokens), build(1)(tokens)
    assert torch.isfinite(first).all()
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.allclose(first, other)
    reference = _tiny_model(seed=0)
    torch.testing.assert_close(build(0).freqs_cos, reference.freqs_cos)
    torch.testing.assert_close(build(0).norm.weight, torch.ones(64))
