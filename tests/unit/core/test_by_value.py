"""ByValue: equal arrays kept as one."""

from __future__ import annotations

import numpy as np

from autoplan.core.by_value import ByValue


def test_equal_arrays_are_handed_the_first_and_others_kept_apart():
    pool = ByValue()
    a = np.array([1.0, np.inf, 2.0])
    assert pool.interned(a) is a
    assert pool.interned(a.copy()) is a
    assert pool.interned(np.array([1.0, np.inf, 3.0])) is not a  # another value
    assert pool.interned(a.astype(np.float32)) is not a  # another dtype
    assert pool.interned(a.reshape(3, 1)) is not a  # another shape
    nan = np.array([np.nan])
    assert pool.interned(nan) is nan
    other = np.array([np.nan])
    assert pool.interned(other) is other  # NaN equals nothing: kept apart
