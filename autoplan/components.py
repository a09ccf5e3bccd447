"""Connected components of named items, for the stages that group nodes (the layer mix,
the layer modes, the ILP's mode blocks).

Input: the items and the pairs that join them. Output: each item's component, named by
one of its members. networkx does the search.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

__all__ = ["components"]


def components(items: Iterable[str], pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each item's component, named by its first member in ``items`` order (a pair's
    ends are items too)."""
    graph = nx.Graph()
    graph.add_nodes_from(items)
    graph.add_edges_from(pairs)
    order = {v: i for i, v in enumerate(graph.nodes)}
    out: dict[str, str] = {}
    for group in nx.connected_components(graph):
        head = min(group, key=order.__getitem__)
        out.update(dict.fromkeys(group, head))
    return out
