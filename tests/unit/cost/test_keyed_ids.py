"""KeyedIds: ids by int64 key in sorted arrays (autoplan.cost.keyed_ids)."""

from __future__ import annotations

import numpy as np

from autoplan.cost.keyed_ids import KeyedIds


def test_keys_added_in_batches_are_found_and_others_are_not():
    """Batches in any order, a key repeated in a batch (its first id kept): every key
    gives its id, as a dict would, and a key never added gives -1."""
    rng = np.random.default_rng(0)
    cache, expected = KeyedIds(), {}
    for _ in range(5):
        keys = rng.integers(0, 1 << 50, 300)
        keys = np.array([k for k in dict.fromkeys(keys.tolist()) if k not in expected])
        ids = rng.integers(0, 1000, len(keys))
        keys, ids = np.append(keys, keys[:3]), np.append(ids, ids[:3] + 1)  # repeats
        cache.add(keys, ids)
        for k, i in zip(keys.tolist(), ids.tolist(), strict=True):
            expected.setdefault(k, i)
    asked = np.array(list(expected) + [-5, 1 << 60, 7])
    want = [expected.get(k, -1) for k in asked.tolist()]
    assert cache.get(asked).tolist() == want
    assert len(cache) == len(expected)


def test_an_empty_cache_finds_nothing():
    assert KeyedIds().get(np.array([0, 3], dtype=np.int64)).tolist() == [-1, -1]
