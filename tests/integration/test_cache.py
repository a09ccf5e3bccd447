"""Signature caching of strategies and prices never changes an answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import autoplan
from autoplan.cost.price import price
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint


@pytest.mark.parametrize(
    "mm_mode,mesh_shape",
    [
        ("einsum", (2, 2)),
        ("native", (2, 2)),
        pytest.param("native", (2, 2, 2), marks=pytest.mark.slow),  # 26 s: 4 s cached
    ],
)
def test_cached_strategies_and_prices_equal_uncached(mm_mode, mesh_shape):
    """On a 3-layer tiny LLaMA, cached and uncached stages give identical strategies and costs."""
    with torch.device("meta"):
        model = Transformer(tiny(3))
    traced, _ = rewrite(trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode=mm_mode)
    mesh = autoplan.fake_mesh(mesh_shape, ("dp", "tp", "cp")[: len(mesh_shape)])
    fast = enumerate_strategies(traced, mesh, mm_mode=mm_mode, cache=True)
    slow = enumerate_strategies(traced, mesh, mm_mode=mm_mode, cache=False)
    assert list(fast.nodes) == list(slow.nodes)
    for name in fast.nodes:
        # repr, not ==: a masked partial's equality includes its per-run mask buffer
        assert repr(fast.nodes[name].strategies) == repr(slow.nodes[name].strategies), name
    topo = autoplan.Topology()
    a, b = price(fast, traced, topo, cache=True), price(slow, traced, topo, cache=False)
    for name in a.compute:
        np.testing.assert_array_equal(a.compute[name], b.compute[name])
    assert len(a.edges) == len(b.edges)
    for ea, eb in zip(a.edges, b.edges, strict=True):
        assert (ea.src, ea.dst, ea.slot) == (eb.src, eb.dst, eb.slot)
        np.testing.assert_array_equal(ea.cost, eb.cost)
        np.testing.assert_array_equal(ea.src_group, eb.src_group)
        np.testing.assert_array_equal(ea.dst_group, eb.dst_group)
