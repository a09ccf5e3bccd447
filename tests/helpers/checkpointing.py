"""The tiny LLaMA job the checkpoint tests share: its batches, its loss and how far two state
dicts differ."""

from __future__ import annotations

import torch
import torch.nn.functional as F

WORLD, BATCH, SEQ, VOCAB, LR = 4, 8, 16, 128, 1e-2


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(
        0, VOCAB, (BATCH, SEQ), generator=g
    )


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
