"""Whole-edge pricing (EdgePricer) equals pair-by-pair pricing, bit for bit.

The reference is ``RedistributeModel.cost_us``, the per-pair path, whose steps
tests/integration/test_redistribute_execution.py checks against the collectives DTensor's
own redistribute runs.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import Partial, Replicate, Shard, _StridedShard
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.redistribute import RedistributeModel


def test_unfused_reduce_scatter_when_the_dim_does_not_divide():
    """PP -> S(0)S(0) on 2x2 is one reduce-scatter when dim 0 divides by 4 and two when it
    does not, and a pricer asked about both shapes keeps them apart."""
    redist = RedistributeModel((2, 2), CollectiveModel(Topology()))
    pricer = EdgePricer(redist)
    p, s0 = Partial(), Shard(0)
    for shape, count in [((8, 4), 1), ((6, 4), 2), ((8, 4), 1)]:
        found = redist.steps((p, p), (s0, s0), shape, 2)
        assert found is not None and len(found) == count, shape
        want = RedistributeModel((2, 2), CollectiveModel(Topology())).cost_us(
            (p, p), (s0, s0), shape, 2
        )
        assert pricer.matrix([(p, p)], [(s0, s0)], shape, 2)[0, 0] == want


def test_moves_on_different_dims_share_a_walk_only_where_the_dims_divide_alike():
    """PP -> S(0)S(0) and PP -> S(1)S(1) on 2x2 fuse into one reduce-scatter only when their
    own dim divides by 4: one pricer asked about (6, 8) and then (8, 6) prices each as the
    pair-by-pair model does, and S(0)S(1) -> S(1)S(0) costs what S(1)S(0) -> S(0)S(1) does (one walk)."""
    mesh = (2, 2)
    pricer = EdgePricer(RedistributeModel(mesh, CollectiveModel(Topology())))
    pairwise = RedistributeModel(mesh, CollectiveModel(Topology()))
    p, s0, s1 = Partial(), Shard(0), Shard(1)
    cols = [(s0, s0), (s1, s1)]
    for shape in [(6, 8), (8, 6), (6, 8)]:
        got = pricer.matrix([(p, p)], cols, shape, 2)[0]
        want = [pairwise.cost_us((p, p), c, shape, 2) for c in cols]
        assert got.tolist() == want, shape
    swap = pricer.matrix([(s0, s1), (s1, s0)], [(s1, s0), (s0, s1)], (8, 8), 2)
    assert swap[0, 0] == swap[1, 1] > 0
    assert swap[0, 0] == pairwise.cost_us((s0, s1), (s1, s0), (8, 8), 2)


def test_equal_placement_tuples_get_one_int_whatever_the_object():
    """The pricer's ints follow equality, not identity: a fresh tuple equal to one seen
    before gets its int, an unequal one a new int."""
    pricer = EdgePricer(RedistributeModel((2, 2), CollectiveModel(Topology())))
    a, c = (Shard(0), Replicate()), (Replicate(), Shard(0))
    b = (Shard(0), Replicate())
    assert b is not a
    assert pricer.ids([a, c, b, a]) == (0, 1, 0, 0)
    assert pricer.ids([(Replicate(), Shard(0)), (Partial(), Partial())]) == (1, 2)


def test_split_factor_one_gets_the_int_and_prices_of_its_shard_spelling():
    """_S(d,1) is S(d): one int, a free move between the spellings, and every price to
    other placements equal to the S(d) spelling's, in both pricers."""
    model = RedistributeModel((2, 2), CollectiveModel(Topology()))
    pricer = EdgePricer(model)
    one = (Shard(0), _StridedShard(0, split_factor=1))
    spelt = (Shard(0), Shard(0))
    others = [(Replicate(), Replicate()), (Shard(1), Replicate()), (Partial(), Shard(0))]
    assert pricer.ids([one])[0] == pricer.ids([spelt])[0]
    assert model.cost_us(one, spelt, (8, 8), 4) == 0.0
    fast = pricer.matrix([one, spelt], others + [one, spelt], (8, 8), 4)
    assert np.array_equal(fast[0], fast[1]) and (fast[:, -2:] == 0).all()
    assert (fast[:, :3] > 0).all()
    for q in others:
        assert model.cost_us(one, q, (8, 8), 4) == model.cost_us(spelt, q, (8, 8), 4)
        assert model.cost_us(q, one, (8, 8), 4) == model.cost_us(q, spelt, (8, 8), 4)


def test_codes_made_in_numpy_are_the_codes_made_pair_by_pair():
    """Random placement tuples on 2x2x2 (S, _S, P, R), two shapes: the numpy forms pick _pair's move for every pair."""
    rng = random.Random(0)
    pricer = EdgePricer(RedistributeModel((2, 2, 2), CollectiveModel(Topology())))
    one = (
        Replicate(), Partial(), Partial("avg"), Shard(0), Shard(1), Shard(2),
        _StridedShard(0, split_factor=2), _StridedShard(1, split_factor=4),
    )  # fmt: skip
    tuples = [tuple(rng.choice(one) for _ in range(3)) for _ in range(60)]
    ids = pricer.ids(tuples)
    src = np.repeat(np.array(ids), len(ids))
    dst = np.tile(np.array(ids), len(ids))
    for div, shape in enumerate(((8, 4, 6), (6, 8, 4))):  # dim 0 divides by 4, then not
        pricer.matrix_of_ids((ids[0],), (ids[0],), shape, 4)  # interns its divisibility
        # as _layout asks: the divisibility where two P source axes may fuse, else -1
        at = np.where([pricer._reduces[a] for a in src.tolist()], div, -1)
        got = pricer._moves_of(src, dst, at, shape)
        pairs = zip(src.tolist(), dst.tolist(), at.tolist(), strict=True)
        want = [pricer._move_id(pricer._pair(a, b, shape)) for a, b, _ in pairs]
        assert got.tolist() == want


@pytest.mark.parametrize("mesh", [(2, 2, 2), (2, 2, 2, 2)])
def test_packed_grid_forms_pick_the_move_of_every_pair(mesh):
    """Random placement tuples on 2x2x2 and 2x2x2x2 (S, _S, P, R): _grid's packed forms
    (one int64 a pair on three axes, two on four), made for the whole grid at once, pick
    _pair's move for every pair whose row cannot fuse a reduce-scatter, on two pricers
    that meet the tuples in different orders."""
    rng = random.Random(1)
    one = (
        Replicate(), Partial(), Partial("avg"), Shard(0), Shard(1), Shard(2),
        _StridedShard(0, split_factor=2), _StridedShard(1, split_factor=4),
    )  # fmt: skip
    tuples = [tuple(rng.choice(one) for _ in range(len(mesh))) for _ in range(80)]
    for order in (tuples, tuples[::-1]):
        pricer = EdgePricer(RedistributeModel(mesh, CollectiveModel(Topology())))
        ids = np.array(pricer.ids(order))
        rows = ids[[not pricer._reduces[i] for i in ids.tolist()]]
        got = pricer._grid(rows, ids, (8, 4, 6))
        assert got.shape == (len(rows), len(ids)) and len(rows) > 40
        want = [[pricer._move_id(pricer._pair(a, b, (8, 4, 6))) for b in ids] for a in rows]
        assert got.tolist() == want
