"""Stage 7, run: a moved shard laid out in memory as the traced value was.

Input: a DTensor a planned move just made and the value the trace recorded for it
(``node.meta["val"]``). Output: the same DTensor, its local shard copied into the traced
value's order of dims in memory when the move changed that order (:func:`as_traced`).

Why: a collective returns a contiguous shard, while the traced value may be a permuted
layout (CPU flash attention returns its output as ``[batch, seq, heads, dim]`` in memory,
viewed as ``[batch, heads, seq, dim]``), and the ops after it were recorded on that
layout: a ``transpose`` then a ``view`` that is legal on the traced strides raises on a
contiguous shard. Restoring the order costs one copy, only where the two differ.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["as_traced", "memory_order"]


def memory_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """``t``'s dims from outermost to innermost in memory, dims of size 1 left out, or
    None when its elements do not tile one dense block (an expanded or sliced value)."""
    strides = t.stride()
    dims = sorted((d for d in range(t.ndim) if t.shape[d] > 1), key=lambda d: -strides[d])
    step = 1
    for d in reversed(dims):
        if strides[d] != step:
            return None
        step *= t.shape[d]
    return tuple(dims)


def as_traced(value: DTensor, traced: object) -> DTensor:
    """``value`` with its local shard in the dim order of ``traced`` (a fake tensor of
    the global value) when both are dense and their orders differ; else ``value``."""
    if not isinstance(traced, torch.Tensor) or traced.is_contiguous():
        return value
    want = memory_order(traced)
    local = value.to_local()
    have = memory_order(local)
    if want is None or have is None:
        return value
    # compare on the dims both lay out (a shard can have size 1 where the value has more)
    wanted = [d for d in want if local.shape[d] > 1]
    if list(have) == wanted:
        return value
    outer = [d for d in range(traced.ndim) if d not in want] + list(want)
    back = sorted(range(traced.ndim), key=outer.__getitem__)
    shard = local.permute(outer).contiguous().permute(back)
    return DTensor.from_local(
        shard, value.device_mesh, value.placements, run_check=False, shape=value.shape,
        stride=value.stride(),
    )  # fmt: skip
