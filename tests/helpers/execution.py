"""Placing a tensor for the tests that run redistributions (under ``LocalTensorMode``)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from autoplan.core.torch_adapter import Partial, Replicate, redistribute


def placed(x: torch.Tensor, mesh, src) -> DTensor:
    """``x`` placed as ``src``; a Partial axis holds x on its first rank and 0 elsewhere.
    (``src_data_rank=None``: cut locally, which also makes uneven strided shards.)"""
    cleared = [Replicate() if isinstance(p, Partial) else p for p in src]
    start = distribute_tensor(x, mesh, cleared, src_data_rank=None)
    return redistribute(start, mesh, src)  # R -> P: local
