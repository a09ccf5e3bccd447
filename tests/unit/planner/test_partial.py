"""Partial through linear ops: the solver may delay a reduction past a multiply."""

from __future__ import annotations

import torch
from torch import nn

import autoplan
from tests.helpers.planning import plan_model


class _RowParallelScaled(nn.Module):
    """A projection whose input arrives sharded on its contracting dim, then a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(256, 64, bias=False)
        self.scale = nn.Parameter(torch.ones(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


def _batch() -> torch.Tensor:
    return torch.randn(16, 512, 256)


def test_partial_flows_through_mul_by_a_replicated_tensor():
    """The projection's partial sum is scaled while still partial; the exact ILP never
    all-reduces the activation (the follower merge may, for the scale's gradient)."""
    tp = autoplan.fake_mesh((8,), ("tp",))
    plan = plan_model(
        _RowParallelScaled, _batch, tp, input_placements=["S(2)"], collapse_followers=False
    )
    muls = [v for v in plan.node_placements.values() if v["op"] == "aten.mul.Tensor"]
    forward_mul = next(v for v in muls if "P" in v["in"] and "R" in v["in"])
    assert forward_mul["out"] == ["P"]
    activation_bytes = 16 * 512 * 64 * 4
    assert plan.comm.get("all_reduce", {}).get("bytes", 0) < activation_bytes
    merged = plan_model(_RowParallelScaled, _batch, tp, input_placements=["S(2)"])
    assert next(
        v["out"] for v in merged.node_placements.values() if v["op"] == "aten.mul.Tensor"
    ) == ["P"]
    assert plan.objective_us <= merged.objective_us


def test_partial_times_replicated_is_exact_by_execution():
    """(sum of per-rank parts) * r equals the sum of (part * r): the rule the plan uses."""
    torch.manual_seed(0)
    full = torch.randn(16, 8, 64, dtype=torch.float64)
    r = torch.randn(64, dtype=torch.float64)
    parts = list(torch.randn(7, 16, 8, 64, dtype=torch.float64))
    parts.append(full - sum(parts))
    torch.testing.assert_close(sum(p * r for p in parts), full * r)
