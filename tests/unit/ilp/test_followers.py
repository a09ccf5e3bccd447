"""Follower merging (autoplan.ilp.reductions.followers): twin layers keep sharing arrays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.reductions.followers import Reduction, collapse_followers
from tests.helpers.priced import priced_tiny_llama


def _unshared(costs: CostTable) -> CostTable:
    """``costs`` with a copy of every array: no two nodes or edges hold the same one."""
    return replace(
        costs,
        compute={v: c.copy() for v, c in costs.compute.items()},
        memory={v: m.copy() for v, m in costs.memory.items()},
        edges=tuple(
            replace(
                e, src_group=e.src_group.copy(), dst_group=e.dst_group.copy(), cost=e.cost.copy()
            )
            for e in costs.edges
        ),
    )


def _arrays(r: Reduction) -> list[np.ndarray]:
    c = r.costs
    out = [*c.compute.values(), *c.memory.values(), *(m for _, m in r.roots.values())]
    for e in c.edges:
        out += [e.src_group, e.dst_group, e.cost]
    return out


def _snapshot(costs: CostTable) -> list[np.ndarray]:
    out = [a.copy() for a in (*costs.compute.values(), *costs.memory.values())]
    return out + [a.copy() for e in costs.edges for a in (e.src_group, e.dst_group, e.cost)]


def test_twin_layers_share_the_arrays_the_merging_makes_and_the_values_are_the_same():
    """On a 4-layer LLaMA, merging the cost table as priced (twin nodes holding the same
    arrays) gives, array for array, the values of merging a copy in which no array is
    shared, with far fewer distinct arrays (each root's compute and each merged node's
    map made once per layer class); the cost table itself is left as it was."""
    traced, table, costs, _ = priced_tiny_llama(4, (2, 2))
    before = _snapshot(costs)
    shared = collapse_followers(table, costs)
    alone = collapse_followers(table, _unshared(costs))
    assert shared.fates == alone.fates
    assert shared.roots.keys() == alone.roots.keys()
    assert shared.costs.compute.keys() == alone.costs.compute.keys()
    assert shared.costs.memory.keys() == alone.costs.memory.keys()
    got, want = _arrays(shared), _arrays(alone)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # the roots' compute and the merged nodes' maps: one array per layer class, not per layer
    for made in (list(shared.costs.compute.values()), [m for _, m in shared.roots.values()]):
        assert len({id(a) for a in made}) < 0.5 * len(made)
    for a, b in zip(_snapshot(costs), before, strict=True):
        np.testing.assert_array_equal(a, b)
