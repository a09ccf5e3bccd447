"""Connected components of named items, for the stages that group nodes (the layer mix,
the layer modes, the ILP's mode blocks).

Input: the items and the pairs that join them. Output: each item's component, named by
one of its members. scipy's csgraph does the search.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

__all__ = ["components"]


def components(items: Iterable[str], pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each item's component, named by its first member in ``items`` order (a pair's
    ends are items too, after ``items``)."""
    index: dict[str, int] = {}
    for v in items:
        index.setdefault(v, len(index))
    ends = [(index.setdefault(a, len(index)), index.setdefault(b, len(index))) for a, b in pairs]
    n = len(index)
    if not n:
        return {}
    rows = np.array([a for a, _ in ends], dtype=np.int64)
    cols = np.array([b for _, b in ends], dtype=np.int64)
    graph = coo_array((np.ones(len(ends), dtype=np.int8), (rows, cols)), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    names = list(index)
    head: dict[int, str] = {}
    for i, lab in enumerate(label.tolist()):  # items in order: the first of each is its name
        head.setdefault(lab, names[i])
    return {v: head[lab] for v, lab in zip(names, label.tolist(), strict=True)}
