"""The tiny LLaMA planned for the memory tests, and the categories of a plan's memory
breakdown."""

from __future__ import annotations

import autoplan
from tests.helpers.planning import plan_tiny_llama

BATCH, SEQ = 8, 32


CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "output_grad", "transient")


def plan_llama(mesh: tuple[int, ...] = (2, 2), **config) -> autoplan.Plan:
    """The tiny LLaMA (batch BATCH, seq SEQ, batch sharded) planned on a fake (dp, tp) mesh
    under ``PlanConfig(**config)``."""
    return plan_tiny_llama(
        autoplan.fake_mesh(mesh, ("dp", "tp")[: len(mesh)]),
        batch=BATCH,
        seq=SEQ,
        input_placements="S(0)" + "R" * (len(mesh) - 1),
        config=autoplan.PlanConfig(**config),
    )
