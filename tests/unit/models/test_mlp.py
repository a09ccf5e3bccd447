"""The tiny MLP reference model (autoplan.models.mlp)."""

import re

import pytest
import torch

from autoplan.models import TinyMLP


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64)])
def test_tiny_mlp_keeps_shape(shape):
    """TinyMLP maps [B, dim] and [B, S, dim] inputs to the same shape."""
    model = TinyMLP()
    model.init_weights(seed=0)
    assert model(torch.randn(shape)).shape == shape
    assert set(dict(model.named_parameters())) == {
        f"layers.{i}.{w}.weight" for i in range(2) for w in ("w1", "w2")
    }


def test_tiny_mlp_init_weights_is_seeded():
    """TinyMLP built on meta, made real and seeded, gives the same output for the same seed."""

    def build(seed: int) -> TinyMLP:
        with torch.device("meta"):
            model = TinyMLP(dim=16, hidden=32, n_layers=3)
        model.to_empty(device="cpu")
        model.init_weights(seed=seed)
        return model

    x = torch.randn(4, 16)
    torch.testing.assert_close(build(3)(x), build(3)(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match=re.escape("hidden (0) must be a positive integer.")):
        TinyMLP(hidden=0)
