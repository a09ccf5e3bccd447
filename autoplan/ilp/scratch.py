"""A float64 buffer reused for one pass over many price matrices.

Used by the steps that write each matrix of a 4-D run into a temporary once (the
tying's rounding, the compaction's scaled prices). Input: the shape wanted. Output: a
view of one buffer in that shape, valid until the next request. Why: on a 4-D mesh a
fresh array per matrix costs more in page faults than the arithmetic written into it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Scratch"]


class Scratch:
    """One buffer, grown to the largest shape asked of it; owned by one pass."""

    def __init__(self) -> None:
        self._buffer = np.empty(0)

    def like(self, shape: tuple[int, ...]) -> np.ndarray:
        """A view of the buffer shaped ``shape``, its values left as they were."""
        size = math.prod(shape)
        if self._buffer.size < size:
            self._buffer = np.empty(size)
        return self._buffer[:size].reshape(shape)
