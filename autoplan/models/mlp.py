"""A residual stack of two-layer GELU MLPs: the smallest model worth planning.

Tests and examples use it where a transformer would add noise: each block is two matmuls,
so the best sharding is known by hand (column-parallel ``w1``, row-parallel ``w2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.core.errors import PlanError


@dataclass(frozen=True)
class MLPArgs:
    """A :class:`TinyMLP`'s arguments, as a run file's ``model.args`` gives them."""

    dim: int = 64
    hidden: int = 256
    n_layers: int = 2


class MLPBlock(nn.Module):
    """``w2(gelu(w1(x)))``, without the residual add."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class TinyMLP(nn.Module):
    """``n_layers`` residual MLP blocks mapping ``[..., dim]`` to the same shape."""

    def __init__(self, dim: int = 64, hidden: int = 256, n_layers: int = 2) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("hidden", hidden), ("n_layers", n_layers)):
            if value < 1:
                raise PlanError(f"{name} ({value}) must be a positive integer.")
        self.layers = nn.ModuleList(MLPBlock(dim, hidden) for _ in range(n_layers))

    @classmethod
    def from_args(cls, args: MLPArgs) -> TinyMLP:
        """The model of ``args``."""
        return cls(args.dim, args.hidden, args.n_layers)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Draw every weight from N(0, 0.02); the same ``seed`` gives the same weights.

        Use after ``to_empty(device=...)`` on a model built on the meta device.
        """
        generator = None
        if seed is not None:
            device = self._blocks()[0].w1.weight.device
            if device.type == "meta":  # meta tensors hold no data; any generator will do
                device = torch.device("cpu")
            generator = torch.Generator(device=device).manual_seed(seed)
        for layer in self._blocks():
            nn.init.normal_(layer.w1.weight, mean=0.0, std=0.02, generator=generator)
            nn.init.normal_(layer.w2.weight, mean=0.0, std=0.02, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x

    def _blocks(self) -> list[MLPBlock]:
        # ModuleList is not generic: the checker cannot know __init__ fills it with MLPBlocks
        return cast(list[MLPBlock], list(self.layers))
