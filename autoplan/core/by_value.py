"""Equal arrays kept as one, for the stages whose arrays twin layers or tied classes
make alike (the layer modes' per-mode roots, the tied problem's edge prices).

Input: arrays, one at a time. Output: for each, the first array of equal dtype, shape and
values handed in (itself when it is the first).

Why: arrays made apart from the same inputs are equal but not one object; read and never
written, they can be one, and a deep model holds them once. Values are told apart by a
digest and checked equal on a match, so a digest collision keeps two arrays, never a
wrong one.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["ByValue"]


class ByValue:
    """A pool of arrays by value (see the module docstring); it lives as long as the stage
    that asks it."""

    def __init__(self) -> None:
        self._kept: dict[tuple[object, ...], np.ndarray] = {}

    def interned(self, a: np.ndarray) -> np.ndarray:
        """The first array handed in equal to ``a`` (``a`` itself when none was)."""
        key = (a.dtype.str, a.shape, hashlib.blake2b(np.ascontiguousarray(a).data).digest())
        found = self._kept.setdefault(key, a)
        return found if found is a or np.array_equal(found, a) else a
