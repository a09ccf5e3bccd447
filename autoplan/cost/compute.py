"""Compute cost of one node under one strategy: a roofline on local (per-rank) shapes.

Input: a node's op, its argument structure and a strategy's placements.
Output: estimated kernel time in microseconds on the topology's device.

    t = (max(FLOPs / (peak · eff_flops), bytes / (HBM · eff_mem)) + overhead) · (1 + skew)

FLOPs come from ``torch.utils.flop_counter``'s registry (einsum's formula added by
:func:`autoplan.cost.flops.op_flops`), evaluated on meta tensors of the *local* shapes,
so a strategy that shards a contracted dim pays for its share only. Bytes are
the local inputs read plus local outputs written. A fused attention kernel reaches its
own share of the peak (``attention_efficiency``). View and alias ops run no kernel:
they cost the host's dispatch, ``view_overhead_us`` (0 on a GPU, whose host runs ahead).
``skew`` is the ranks' drift per unit of compute (``collectives.skew``, 0 on one rank):
the step waits at its collectives for the slowest rank.

The efficiencies and the per-op overhead are the device's
(:class:`autoplan.core.topology.Device`): datasheet shares for the presets, measured
figures for a calibrated topology (``autoplan calibrate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import fx

from autoplan.core.graph import map_args, node_op, static_args
from autoplan.core.placements import Placements, local_shape, num_elements
from autoplan.core.topology import Device, Topology
from autoplan.cost.flops import op_flops
from autoplan.strategies.table import NodeStrategies

aten = torch.ops.aten

Real = TypeVar("Real", float, np.ndarray)

# The CPU attention kernels a CPU trace produces have the GPU kernels' FLOPs.
_FLOP_ALIASES = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: aten._scaled_dot_product_flash_attention_backward.default,
}

_LOW_PRECISION = {"torch.bfloat16", "torch.float16"}

# The fused attention kernels, forward and backward: priced at attention_efficiency.
ATTENTION_OPS = frozenset(
    {
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_backward.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_efficient_attention_backward.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_cudnn_attention_backward.default,
        *_FLOP_ALIASES,
    }
)


def roofline_us(
    device: Device, flops: Real, nbytes: Real, low_precision: bool, *, attention: bool = False
) -> Real:
    """One op on ``device``: ``max(FLOPs / (peak x eff), bytes / (bandwidth x eff)) +
    overhead``, a fused attention kernel's peak times ``attention_efficiency`` (the drift
    left to :class:`ComputeModel`); of one op, or elementwise over arrays of them."""
    peak = device.peak_bf16_tflops if low_precision else device.peak_fp32_tflops
    if attention:
        peak *= device.attention_efficiency
    t_flops = flops / (peak * 1e6 * device.flops_efficiency)  # TFLOP/s = 1e6 FLOP/us
    t_memory = _memory_us(device, nbytes)
    # one op's time stays a Python float: callers write it to YAML and JSON
    if isinstance(t_flops, np.ndarray) or isinstance(t_memory, np.ndarray):
        return np.maximum(t_flops, t_memory) + device.op_overhead_us
    return max(t_flops, t_memory) + device.op_overhead_us


def _memory_us(device: Device, nbytes: Real) -> Real:
    return nbytes / (device.hbm_gbps * 1e3 * device.memory_efficiency)  # GB/s = 1e3 B/us


class ComputeModel:
    """Prices node strategies on one device; owns a cache keyed by local shapes."""

    def __init__(self, device: Device, mesh_shape: Sequence[int], skew: float = 0.0) -> None:
        self.device = device
        self.mesh_shape = tuple(mesh_shape)
        self.scale = 1.0 + skew
        self._flops: dict[tuple[Any, ...], int] = {}
        self._static: dict[fx.Node, Any] = {}  # static_args per node, read once

    @classmethod
    def of(cls, topology: Topology, mesh_shape: Sequence[int]) -> ComputeModel:
        """The model of ``topology``'s device on a mesh of ``mesh_shape``, with its drift
        (``collectives.skew``) on a mesh of more than one rank."""
        # ranks drift apart as they compute, and every collective waits for the slowest
        fits = topology.collectives
        many = math.prod(mesh_shape) > 1
        return cls(topology.device, mesh_shape, fits.skew if fits is not None and many else 0.0)

    @property
    def view_us(self) -> float:
        """A view or alias op: the host's dispatch."""
        return self.device.view_overhead_us * self.scale

    def copy_us(self, nbytes: float, launches: float = 1.0) -> float:
        """A copy of ``nbytes`` into another buffer, read and written once, by
        ``launches`` ops (a share of one, for a part of a larger copy)."""
        d = self.device
        return (_memory_us(d, 2 * nbytes) + launches * d.op_overhead_us) * self.scale

    def times_us(self, ns: NodeStrategies, node: fx.Node) -> np.ndarray:
        """Kernel time of ``node`` run per each of its strategies (a view's dispatch, 0
        for placeholders)."""
        count = len(ns.strategies)
        if ns.kind != "op":
            return np.zeros(count)
        if ns.free:
            return np.full(count, self.view_us)
        mesh = self.mesh_shape
        ins = [(t.shape, t.dtype_bytes) for t in ns.in_tensors]
        outs = [None if t is None else (t.shape, t.dtype_bytes) for t in ns.out_tensors]
        flops = np.empty(count)
        nbytes = np.empty(count)
        for k, strategy in enumerate(ns.strategies):
            in_shapes = [
                local_shape(shape, p, mesh) for (shape, _), p in zip(ins, strategy.ins, strict=True)
            ]
            out_shapes = [
                None if t is None or p is None else local_shape(t[0], p, mesh)
                for t, p in zip(outs, strategy.outs, strict=True)
            ]
            # ints, summed exactly: the same bytes whatever the order
            read = sum(num_elements(s) * b for s, (_, b) in zip(in_shapes, ins, strict=True))
            written = sum(
                num_elements(s) * t[1]
                for s, t in zip(out_shapes, outs, strict=True)
                if s is not None and t is not None
            )
            nbytes[k] = read + written
            flops[k] = self._node_flops(node, in_shapes, out_shapes)
        low = any(t is not None and t.dtype in _LOW_PRECISION for t in ns.out_tensors)
        attention = node.target in ATTENTION_OPS
        return roofline_us(self.device, flops, nbytes, low, attention=attention) * self.scale

    def _node_flops(
        self,
        node: fx.Node,
        in_shapes: list[tuple[int, ...]],
        out_shapes: list[tuple[int, ...] | None],
    ) -> int:
        target = node_op(node)
        op = _FLOP_ALIASES.get(target, target)
        static = self._static.get(node)
        if static is None:
            static = self._static[node] = static_args(node)
        key = (op, tuple(in_shapes), tuple(out_shapes), static)
        cached = self._flops.get(key)
        if cached is not None:
            return cached
        shapes = iter(in_shapes)

        def meta_like(n: fx.Node) -> Any:
            return torch.empty(next(shapes), dtype=n.meta["val"].dtype, device="meta")

        args = map_args(node.args, meta_like)
        kwargs = map_args(dict(node.kwargs), meta_like)
        outs = [None if s is None else torch.empty(s, device="meta") for s in out_shapes]
        out = outs[0] if len(outs) == 1 else tuple(outs)
        try:
            flops = op_flops(op, args, kwargs, out)
        except Exception:  # a formula that rejects a local shape: price bytes only
            flops = 0
        self._flops[key] = flops
        return flops


def placements_bytes(
    shape: Sequence[int], dtype_bytes: int, p: Placements, mesh_shape: Sequence[int]
) -> int:
    """Bytes one rank holds of a tensor of ``shape`` placed as ``p``."""
    return num_elements(local_shape(shape, p, mesh_shape)) * dtype_bytes
