"""The reused buffer: views of the asked shape, one buffer until a larger one is asked."""

from __future__ import annotations

import numpy as np

from autoplan.ilp.scratch import Scratch


def test_views_share_one_buffer_that_grows_only_for_a_larger_shape():
    """A view has the shape asked; a smaller or equal request reuses the buffer, a larger
    one replaces it."""
    scratch = Scratch()
    first = scratch.like((3, 4))
    assert first.shape == (3, 4) and first.dtype == np.float64
    first[:] = 1.0
    smaller = scratch.like((2, 5))
    assert smaller.shape == (2, 5) and np.shares_memory(first, smaller)
    larger = scratch.like((5, 5))
    assert larger.shape == (5, 5) and not np.shares_memory(first, larger)
    assert np.shares_memory(scratch.like((1, 25)), larger)
    assert scratch.like((0, 7)).shape == (0, 7)
