"""The tiny LLaMA traced on a fake mesh, with its strategies, prices and allowed strategies
(batch sharded on the first axis), for tests that build the ILP themselves."""

from __future__ import annotations

import torch

import autoplan
from autoplan.cost.price import price
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.constraints import allowed_strategies
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint


def priced_tiny_llama(layers: int, shape: tuple[int, ...], *, routes: bool = False):
    """(traced graph, strategy table, costs, allowed strategies) of a ``layers``-layer tiny
    LLaMA on a fake mesh of ``shape``; ``routes``: edges priced by their cheapest routes."""
    mesh = autoplan.fake_mesh(shape, ("dp", "tp")[: len(shape)])
    with torch.device("meta"):
        model = Transformer(tiny(layers))
    traced, _ = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (8, 32))), mm_mode="einsum"
    )
    table = enumerate_strategies(traced, mesh)
    costs = price(table, traced, autoplan.Topology(), routes=routes)
    allowed, _ = allowed_strategies(traced, table, ["S(0)" + "R" * (len(shape) - 1)], None, None)
    return traced, table, costs, allowed
