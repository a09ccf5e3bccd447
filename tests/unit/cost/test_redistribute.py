"""Redistribution prices: the collectives DTensor runs, on their axis groups."""

from __future__ import annotations

import math

from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import Partial, Replicate, Shard
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.redistribute import RedistributeModel

R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)
SHAPE = (1024, 4096)


def _model(mesh=(8, 8)):
    return RedistributeModel(mesh, CollectiveModel(Topology()))


def test_same_placement_is_free():
    """cost(s, s) == 0 for every placement."""
    m = _model()
    for p in [(R, R), (S0, S1), (P, R), (S0, S0)]:
        assert m.cost_us(p, p, SHAPE, 2) == 0.0


def test_slicing_is_free_and_gathering_is_not():
    """R -> S is a local slice; S -> R is an all-gather."""
    m = _model()
    assert m.cost_us((R, R), (S0, S1), SHAPE, 2) == 0.0
    assert m.cost_us((S0, R), (R, R), SHAPE, 2) > 0.0


def test_shard_to_partial_does_not_exist():
    """A move DTensor cannot make is infinite (it becomes no ILP variable)."""
    assert math.isinf(_model().cost_us((S0, R), (P, R), SHAPE, 2))


def test_allreduce_cheaper_than_reduce_scatter_plus_allgather():
    """P -> R costs less than P -> S followed by S -> R."""
    m = _model()
    ar = m.cost_us((R, P), (R, R), SHAPE, 2)
    rs_ag = m.cost_us((R, P), (R, S0), SHAPE, 2) + m.cost_us((R, S0), (R, R), SHAPE, 2)
    assert ar < rs_ag


def test_fused_flattened_gather_is_one_collective_and_cheaper():
    """S(0)S(0) -> RR is priced as one all-gather over 64 ranks, cheaper than two steps."""
    m = _model()
    steps = m.steps((S0, S0), (R, R), SHAPE, 2)
    assert steps is not None and len(steps) == 1 and steps[0][1] == (0, 1)
    two = m.cost_us((S0, S0), (S0, R), SHAPE, 2) + m.cost_us((S0, R), (R, R), SHAPE, 2)
    assert m.cost_us((S0, S0), (R, R), SHAPE, 2) < two


def test_cost_rises_with_bytes_and_crossing_nodes_costs_more():
    """Bigger tensors cost more; the inter-node axis (dp) costs more than the intra-node one."""
    m = _model()
    small = m.cost_us((R, S0), (R, R), (1024, 1024), 2)
    big = m.cost_us((R, S0), (R, R), (8192, 1024), 2)
    assert big > small
    inter = m.cost_us((S0, R), (R, R), SHAPE, 2)
    intra = m.cost_us((R, S0), (R, R), SHAPE, 2)
    assert inter > intra
