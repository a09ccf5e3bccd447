"""layout: a moved shard laid out in memory as the traced value was, checked by running
the move and the ops recorded after it under LocalTensorMode."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.core.torch_adapter import LocalTensorMode, Replicate, Shard, redistribute
from autoplan.runtime.layout import as_traced, memory_order
from tests.helpers.execution import placed

B, S, H, D = 4, 6, 4, 8


def _attention_like() -> torch.Tensor:
    """[B, H, S, D] laid out as [B, S, H, D] in memory, as CPU flash attention returns it."""
    return torch.arange(float(B * S * H * D)).reshape(B, S, H, D).transpose(1, 2)


def test_memory_order_reads_the_dims_outermost_first():
    x = _attention_like()
    assert memory_order(x.contiguous()) == (0, 1, 2, 3)
    assert memory_order(x) == (0, 2, 1, 3)
    assert memory_order(torch.zeros(3, 5)[:, :2]) is None  # a slice: not one dense block
    assert memory_order(torch.zeros(3, 1).expand(3, 4)) is None  # expanded


def test_a_size_one_dim_has_no_place_in_the_order():
    """Where a dim is 1 its stride says nothing: only the others are ordered."""
    x = torch.zeros(3, 1, 5)
    assert memory_order(x) == (0, 2)
    assert memory_order(x.transpose(0, 1)) == (1, 2)  # (1, 3, 5): the same block
    assert memory_order(x.transpose(0, 2)) == (2, 0)


def test_a_gathered_shard_takes_the_traced_layout_back():
    """Heads sharded on one axis, gathered to replicated: the collective's shard is
    contiguous, the recorded transpose-then-view raises on it, and runs on the shard
    laid out as traced, with the values of one device."""
    x = _attention_like()
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    expected = x.transpose(1, 2).reshape(B, S, H * D)
    with LocalTensorMode(mesh.size()):
        moved = redistribute(placed(x, mesh, (Replicate(), Shard(1))), mesh, (Replicate(),) * 2)
        with pytest.raises(RuntimeError, match="view"):
            moved.transpose(1, 2).view(B, S, H * D)
        fixed = as_traced(moved, x)
        out = fixed.transpose(1, 2).view(B, S, H * D)
        assert torch.equal(out.full_tensor(), expected)
        assert fixed.placements == moved.placements and fixed.shape == moved.shape


def test_a_shard_already_in_the_traced_order_is_left_alone():
    """Nothing is copied for a contiguous trace, no trace, or a shard in the traced order."""
    x = _attention_like()
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with LocalTensorMode(mesh.size()):
        moved = redistribute(placed(x, mesh, (Replicate(), Shard(1))), mesh, (Replicate(),) * 2)
        assert as_traced(moved, x.contiguous()) is moved
        assert as_traced(moved, None) is moved
        fixed = as_traced(moved, x)
        assert fixed is not moved
        assert as_traced(fixed, x) is fixed
