"""Models with frozen parameters, their inputs and pins, for the frozen-parameter tests."""

from __future__ import annotations

import torch
from torch import nn

WORLD, MESH, AXES = 4, (2, 2), ("dp", "tp")


STEPS, LR, VOCAB = 3, 1e-2, 32


class Adapted(nn.Module):
    """A frozen base under a trainable head: the input layer's weight frozen, the middle
    layer frozen whole (the gradient still flows through it), a buffer scaling."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Linear(32, 32)
        self.out = nn.Linear(32, 16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 32))
        self.inp.weight.requires_grad_(False)
        self.mid.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x)) * self.scale
        return self.out(torch.relu(self.mid(h)))


class TiedFrozen(nn.Module):
    """A frozen embedding tied to the output head, one trainable layer between."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.embed.weight.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(ids))))


MODELS = {
    "adapted": (Adapted, lambda: torch.randn(8, 4, 16)),
    "tied": (TiedFrozen, lambda: torch.randint(0, VOCAB, (8, 4))),
}


# the frozen weights sharded, so the forward gathers or computes on shards of them
PINS = {
    "adapted": {"inp.weight": "S(0)S(1)", "mid.weight": "RS(0)"},
    "tied": {"embed.weight": "RS(0)"},  # vocabulary split on tp, lookup and head alike
}
