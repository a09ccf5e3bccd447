"""Tracing a training step for the graph-rewrite tests: real tensors, so the graph can run."""

from __future__ import annotations

import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx


def trace_step(model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """make_fx of the joint forward+backward step, on real tensors so it can run."""
    names = [n for n, _ in model.named_parameters()]

    def step(params, x):
        out = torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))
        loss = out.float().mean()
        return loss, torch.autograd.grad(loss, params)

    return make_fx(step)(list(model.parameters()), x)
