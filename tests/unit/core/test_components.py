"""components: each item named by the first member of its connected component."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from autoplan.core.components import components


def test_names_follow_item_order_and_pair_ends_join():
    """A pair's ends join one component, named by its earliest item; ends missing from
    ``items`` are items after them; an item with no pair is its own component."""
    got = components(["c", "a", "b", "lone"], [("a", "b"), ("b", "c"), ("x", "a"), ("y", "z")])
    assert got == {
        "c": "c",
        "a": "c",
        "b": "c",
        "x": "c",
        "lone": "lone",
        "y": "y",
        "z": "y",
    }
    assert components([], []) == {}


@pytest.mark.parametrize("seed", range(5))
def test_components_equal_networkx_on_random_graphs(seed):
    """The same partition as networkx's connected_components on random sparse graphs."""
    rng = np.random.default_rng(seed)
    items = [f"v{i}" for i in rng.permutation(60)]
    pairs = [(f"v{a}", f"v{b}") for a, b in rng.integers(0, 70, (40, 2))]
    got = components(items, pairs)
    graph = nx.Graph()
    graph.add_nodes_from(items)
    graph.add_edges_from(pairs)
    want = {frozenset(g) for g in nx.connected_components(graph)}
    assert {frozenset(v for v in got if got[v] == h) for h in set(got.values())} == want
    order = list(graph.nodes)
    for group in want:
        assert {got[v] for v in group} == {min(group, key=order.index)}
