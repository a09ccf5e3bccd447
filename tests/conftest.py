"""Shared fixtures: tiny models and planning meshes (fake process groups)."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.models.mlp import TinyMLP


@pytest.fixture
def mesh8():
    """A 1-D fake mesh of 8 ranks."""
    return autoplan.fake_mesh((8,), ("dp",))


@pytest.fixture
def meta_mlp():
    """A two-block MLP on the meta device."""
    with torch.device("meta"):
        return TinyMLP(dim=64, hidden=256, n_layers=2)
