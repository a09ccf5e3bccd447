"""Whole-edge pricing (EdgePricer) equals pair-by-pair pricing, bit for bit.

The reference is ``RedistributeModel.cost_us``, the per-pair path, whose steps
tests/integration/test_redistribute_execution.py checks against the collectives DTensor's
own redistribute runs.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import autoplan
from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import Partial, Replicate, Shard, _StridedShard
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.price import price
from autoplan.cost.redistribute import RedistributeModel
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint
from tests.helpers.edge_checks import check_pairs


@pytest.mark.parametrize(
    "mm_mode, mesh_shape",
    [
        ("einsum", (2, 2)),
        ("native", (2, 2)),
        ("einsum", (2, 2, 2)),
        pytest.param("native", (2, 2, 2), marks=pytest.mark.slow),
    ],
)
def test_every_edge_of_a_tiny_llama_equals_pair_by_pair_prices(mm_mode, mesh_shape):
    """price()'s edge matrices on a tiny LLaMA equal cost_us on every
    edge (a seeded sample of pairs per edge: 2x2x2 edges reach 10^5 pairs)."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced, _ = rewrite(trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode=mm_mode)
    mesh = autoplan.fake_mesh(mesh_shape, ("dp", "tp", "cp")[: len(mesh_shape)])
    table = enumerate_strategies(traced, mesh, mm_mode=mm_mode)
    costs = price(table, traced, Topology(), reduce_bytes=4)
    refs = (RedistributeModel(mesh_shape, CollectiveModel(Topology())),)
    rng = random.Random(0)
    strided = impossible = 0
    distinct = {id(e.cost): e for e in costs.edges}  # twin edges share one matrix
    for e in distinct.values():
        assert e.tensor is not None
        rows, cols = e.src_placements, e.dst_placements
        strided += any(isinstance(p, _StridedShard) for p in itertools.chain(*rows, *cols))
        impossible += int(np.isinf(e.cost).sum())
        pairs = list(itertools.product(range(len(rows)), range(len(cols))))
        sample = pairs if len(pairs) <= 64 else rng.sample(pairs, 64)
        what = f"{e.src} -> {e.dst} slot {e.slot}"
        check_pairs(e.cost, rows, cols, e.tensor.shape, e.tensor.dtype_bytes, refs, sample, what)
    assert impossible, "some moves (S -> P) should be impossible"
    assert strided or mm_mode == "einsum", "native mode should offer _StridedShard placements"


def test_one_pricer_across_shapes_forms_and_partial_kinds():
    """One pricer reused across shapes that do and do not divide by the flattened groups
    (which decides whether PP -> S(0)S(0) is one reduce-scatter), strided shards of two split
    factors and two Partial kinds equals both references on every pair."""
    axis = [
        Replicate(),
        Partial(),
        Partial("avg"),
        Shard(0),
        Shard(1),
        _StridedShard(0, split_factor=2),
        _StridedShard(0, split_factor=4),
    ]
    for mesh_shape in [(2, 2), (2, 4), (2, 2, 2), (2, 2, 2, 2)]:
        pricer = EdgePricer(RedistributeModel(mesh_shape, CollectiveModel(Topology())))
        refs = (RedistributeModel(mesh_shape, CollectiveModel(Topology())),)
        placements = list(itertools.product(axis, repeat=len(mesh_shape)))
        wide = len(mesh_shape) == 4  # 2 401 tuples: a sparser sample
        rows, cols = placements[:: 29 if wide else 5], placements[1 :: 31 if wide else 4]
        pairs = list(itertools.product(range(len(rows)), range(len(cols))))
        for shape, dtype_bytes in [((16, 8), 2), ((6, 12), 2), ((8, 6), 4), ((1024, 4096), 2)]:
            fast = pricer.matrix(rows, cols, shape, dtype_bytes)
            check_pairs(fast, rows, cols, shape, dtype_bytes, refs, pairs, f"{mesh_shape} {shape}")
        assert np.isinf(fast).any() and (fast == 0).any() and (fast > 0).any()
