"""Hugging Face mixture-of-experts layers in the capacity form, as a ``transformers``
experts implementation named ``autoplan_capacity``.

Input: a ``transformers`` experts module (Mixtral's, Qwen3-MoE's, ...: ``gate_up_proj
[experts, 2 * hidden, dim]``, ``down_proj [experts, dim, hidden]``) and what its router
chose: the tokens ``[tokens, dim]``, each token's ``top_k`` expert ids and their weights.
Output: the experts' weighted sum per token, ``[tokens, dim]``.

Why: ``transformers``' own implementations cannot be planned. ``eager`` loops over the
experts hit with ``nonzero``/``where`` (shapes that depend on the data: not traceable on
fake tensors); ``batched_mm`` gathers a weight matrix per token (``[tokens * k, 2 *
hidden, dim]``, terabytes at Mixtral's size); ``grouped_mm`` calls a kernel DTensor has
no sharding rule for. This one is :mod:`autoplan.models.moe`'s: tokens are routed in
groups of ``group_size``, each expert takes at most ``capacity_factor * k * group /
experts`` tokens of a group, and dispatch, experts and combine are einsums, so expert
parallelism is ``Shard`` on the expert dimension and the dispatch an all-to-all the
planner prices. With a capacity that drops no token (``capacity_factor >= experts /
top_k``) it computes what ``eager`` does.

``capacity_factor`` and ``group_size`` are read from the model's config (defaults
:data:`CAPACITY_FACTOR`, :data:`GROUP_SIZE`). :func:`register` makes the name known to
``transformers`` (process-wide, as the ``autoplan_sdpa`` attention is); importing this
module registers nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.models import moe

NAME = "autoplan_capacity"
CAPACITY_FACTOR = 1.25
GROUP_SIZE = 1024
CONFIG_KEYS = ("capacity_factor", "group_size", "experts_implementation")


def register() -> None:
    """Make ``autoplan_capacity`` known to ``transformers``' ``ExpertsInterface``
    (idempotent: the same name, the same function)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, capacity_experts_forward)


def routing_group(config: Any, tokens: int) -> int:
    """Tokens per routing group for ``tokens`` tokens: the config's ``group_size``, or all of
    them when fewer; a PlanError when they do not split into such groups."""
    size = int(getattr(config, "group_size", GROUP_SIZE))
    group = moe.routing_group(size, tokens)
    if group is None:
        raise PlanError(
            f"{tokens} tokens (batch x seq) do not split into routing groups of group_size "
            f"({size}); give a batch x seq that is a multiple of it, or set model.config."
            "group_size to a divisor of it."
        )
    return group


def capacity_experts_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts of ``self`` on ``hidden_states [tokens, dim]``, each token sent to its
    ``top_k_index`` experts and weighted by ``top_k_weights`` (both ``[tokens, k]``), in
    the capacity form (see the module docstring)."""
    tokens, dim = hidden_states.shape
    k = top_k_index.shape[-1]
    experts = int(self.num_experts)  # type: ignore[arg-type]
    group = routing_group(self.config, tokens)
    factor = float(getattr(self.config, "capacity_factor", CAPACITY_FACTOR))
    capacity = moe.expert_capacity(factor, k, group, experts)
    x = hidden_states.reshape(tokens // group, group, dim)
    chosen = top_k_index.reshape(tokens // group, group, k)
    weights = top_k_weights.reshape(tokens // group, group, k)
    dispatch, combine = moe.dispatch_masks(chosen, weights, experts, capacity, x.dtype)
    routed = torch.einsum("gsec,gsd->gecd", dispatch, x)
    up = torch.einsum("gecd,efd->gecf", routed, self.gate_up_proj)
    hidden = self._apply_gate(up)  # type: ignore[operator]
    out = torch.einsum("gecf,edf->gecd", hidden, self.down_proj)
    return torch.einsum("gsec,gecd->gsd", combine, out).reshape(tokens, dim)
