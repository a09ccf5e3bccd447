"""Small ints by key: the move ids of priced pairs, kept in sorted arrays, and the ids
of hashable items in first-seen order.

Stage 4, cost (used by :class:`~autoplan.cost.edge_prices.EdgePricer`). Input: keys
packing a (row, column, divisibility) pair and the move id found for each
(:class:`KeyedIds`), or one hashable item at a time (:func:`intern`: divisibilities,
moves, collective terms). Output: the ids of keys seen before, -1 for the others,
looked up for a whole batch at once; an item's id, new ones numbered in turn.

Why: a 4-D run prices millions of pairs, a third of them distinct; a dict of Python
ints looks them up one at a time and holds each in about a hundred bytes, where a
sorted array does a batch with one ``searchsorted`` and holds a key in sixteen. The
items :func:`intern` numbers are few (thousands), and a dict suits them.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

__all__ = ["KeyedIds", "intern"]

K = TypeVar("K")


def intern(index: dict[K, int], items: list[K], key: K) -> int:
    """``key``'s place in ``items``, appended (and noted in ``index``) when new."""
    i = index.get(key)
    if i is None:
        i = index[key] = len(items)
        items.append(key)
    return i


class KeyedIds:
    """Ids by key: :meth:`get` a batch, :meth:`add` the ones found."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.intp)

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The id of each of ``keys``, -1 where it was never added."""
        out = np.full(len(keys), -1, dtype=np.intp)
        if not len(self._keys):
            return out
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        found = self._keys[at] == keys
        out[found] = self._ids[at[found]]
        return out

    def add(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Remember ``ids[i]`` for ``keys[i]`` (keys not added before; a key repeated
        in the batch takes its first id)."""
        keys, first = np.unique(keys, return_index=True)
        at = np.searchsorted(self._keys, keys)  # a merge of two sorted lists, no sort
        self._keys = np.insert(self._keys, at, keys)
        self._ids = np.insert(self._ids, at, np.asarray(ids, dtype=np.intp)[first])
