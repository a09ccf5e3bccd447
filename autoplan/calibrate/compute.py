"""Measuring compute: matmul throughput, memory bandwidth and the per-op overhead.

Stage: measurement, beside :mod:`autoplan.calibrate.comm`.
Input: the :class:`~autoplan.calibrate.settings.Settings` and a
:class:`~autoplan.calibrate.timing.Clock` (every rank runs each op at the same time:
ranks sharing a node share its cores, caches and memory bus, as in a step).
Output: a :class:`ComputeSample` per op and size, with the FLOPs and bytes the compute
model (:mod:`autoplan.cost.compute`) counts for it: a matmul's inputs read and output
written, a pointwise op's two inputs and output, a reduction's input and output.
Why these ops: the roofline prices a node by its FLOPs at the dtype's peak, its bytes at
the memory bandwidth, plus a fixed cost per op; matmuls at the model's shape classes
show the peak, large pointwise and reduction ops the bandwidth, tiny ops the fixed cost
(an eager CPU op's dispatch, a GPU kernel's launch), which dominates small models.
A fused attention kernel (SDPA, forward and backward) reaches its own share of the peak,
and a view op runs no kernel but is a dispatcher call on the host.
Each op allocates its output, as the ops of a step do, and is called as a lowered
program calls it (an ATen overload); pointwise and reduction operands cycle through
buffers larger than the caches, as a step's ops read values written long before. The tiny
ops, the views and the smaller pointwise and reduction ops are called in one rotation
(:meth:`~autoplan.calibrate.timing.Clock.add_rotation`), as a program calls many ops in
turn: on a CPU, a small op called in a loop of itself keeps its dispatch code in the
caches and takes a fraction of its time in a program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from autoplan.calibrate.settings import TURN_NUMEL, Settings
from autoplan.calibrate.timing import Clock

__all__ = ["KINDS", "MATMUL_DTYPES", "ComputeSample", "measure_compute"]

KINDS = ("overhead", "matmul", "pointwise", "reduction", "attention", "view")
MATMUL_DTYPES = ("float32", "bfloat16")
"""The dtypes of the device's two peaks (float16 is priced at the bfloat16 peak)."""
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_aten = torch.ops.aten
_MAX_PAIRS = 4096
"""Operand pairs a small op cycles through: its calls still leave the per-core caches."""


@dataclass(frozen=True)
class ComputeSample:
    """One measured op."""

    kind: str
    """One of :data:`KINDS`."""
    label: str
    """What ran: ``mm 512x512x512``, ``add 4096``."""
    dtype: str
    flops: float
    nbytes: float
    time_us: float


def measure_compute(
    settings: Settings, clock: Clock, progress: Callable[[str], None] | None = None
) -> list[ComputeSample]:
    """Tiny ops, pointwise and reduction ops over ``pointwise_numels``, and matmuls at
    every shape class and dtype, each timed on every rank at once, taking turns."""
    if progress is not None:
        progress("compute")
    device = clock.device
    queued: list[tuple[str, str, str, float, float]] = []

    def add(kind: str, label: str, dtype: str, flops: float, nbytes: float, run) -> None:
        clock.add(
            run, repeats=settings.compute_repeats, min_us=settings.compute_min_us,
            max_inner=settings.max_inner,
        )  # fmt: skip
        queued.append((kind, label, dtype, flops, nbytes))

    # the overhead through the call a lowered program makes (an ATen overload), not a
    # Tensor method's faster path; tiny ops, views and the smaller pointwise and
    # reduction ops in one rotation, as a program calls many ops in turn
    turns: list[tuple[tuple[str, str, str, float, float], Callable[[], object]]] = []
    one = torch.ones(1, device=device)
    for name, op in (("add", _aten.add.Tensor), ("mul", _aten.mul.Tensor)):
        turns.append((("overhead", f"{name} 1", "float32", 0, 12), partial(op, one, one)))
    for name, unary in (
        ("sum", _aten.sum.default), ("neg", _aten.neg.default), ("exp", _aten.exp.default),
        ("rsqrt", _aten.rsqrt.default), ("clone", _aten.clone.default),
    ):  # fmt: skip
        turns.append((("overhead", f"{name} 1", "float32", 0, 8), partial(unary, one)))
    x = torch.rand(8, 16, 32, device=device)
    for label, view in (
        ("view", lambda: _aten.view.default(x, [128, 32])),
        ("permute", lambda: _aten.permute.default(x, [1, 0, 2])),
        ("transpose", lambda: _aten.transpose.int(x, 0, 1)),
        ("unsqueeze", lambda: _aten.unsqueeze.default(x, 0)),
        ("slice", lambda: _aten.slice.Tensor(x, 2, 0, 16)),
        ("expand", lambda: _aten.expand.default(x, [2, 8, 16, 32])),
    ):
        turns.append((("view", label, "float32", 0, 0), view))
    pool = torch.rand(settings.cold_bytes // 4, device=device)
    for numel in settings.pointwise_numels:
        pairs = _cold_pairs(pool, numel)
        ops: list[tuple[tuple[str, str, str, float, float], Callable[[], object]]] = [
            (("pointwise", f"{name} {numel}", "float32", 0, 12 * numel), _cycling(op, pairs, k))
            for k, (name, op) in enumerate((("add", _aten.add.Tensor), ("mul", _aten.mul.Tensor)))
        ]
        sums = _cycling(lambda a, _b: _aten.sum.default(a), pairs, 2)
        ops.append((("reduction", f"sum {numel}", "float32", 0, 4 * numel + 4), sums))
        if numel <= TURN_NUMEL:
            turns += ops
        else:
            for what, run in ops:
                add(*what, run)
    clock.add_rotation(
        [run for _, run in turns], repeats=settings.compute_repeats,
        min_us=settings.compute_min_us, max_inner=settings.max_inner,
    )  # fmt: skip
    queued += [what for what, _ in turns]
    # attention as a training step runs it: causal (as a decoder's), the forward and the
    # forward with its backward, at the dtype of the device's fast peak
    dtype = "float32" if device.type == "cpu" else "bfloat16"
    for shape in settings.attention_shapes():
        qkv = [torch.rand(shape, device=device, dtype=_DTYPES[dtype]) for _ in range(3)]
        label = "x".join(map(str, shape))
        fwd = sdpa_flop_count(shape, shape, shape)
        nbytes = 4 * qkv[0].numel() * qkv[0].element_size()
        add("attention", f"sdpa {label}", dtype, fwd, nbytes, _attention(qkv, False))
        both = fwd + sdpa_backward_flop_count(shape, shape, shape, shape)
        add("attention", f"sdpa+bwd {label}", dtype, both, 2 * nbytes, _attention(qkv, True))
    for dtype in MATMUL_DTYPES:
        for _, (m, k, n), _ in settings.matmul_shapes():
            a = torch.rand(m, k, device=device).to(_DTYPES[dtype])
            b = torch.rand(k, n, device=device).to(_DTYPES[dtype])
            nbytes = (m * k + k * n + m * n) * a.element_size()
            add("matmul", f"mm {m}x{k}x{n}", dtype, 2 * m * k * n, nbytes, lambda a=a, b=b: a @ b)
    times = clock.settle()
    return [ComputeSample(*q, t) for q, t in zip(queued, times, strict=True)]


def _attention(qkv: list[torch.Tensor], backward: bool) -> Callable[[], None]:
    """Causal SDPA on ``qkv``, with its backward when ``backward``."""
    q, k, v = (t.detach().requires_grad_(backward) for t in qkv)
    grad = torch.ones_like(q)

    def run() -> None:
        with torch.set_grad_enabled(backward):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            if backward:
                torch.autograd.grad(out, (q, k, v), grad)

    return run


def _cold_pairs(pool: torch.Tensor, numel: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Operand pairs of ``numel`` elements side by side along ``pool`` (at most
    :data:`_MAX_PAIRS`), or one pair of their own when ``pool`` cannot hold two."""
    if 2 * numel > pool.numel():
        return [(torch.rand(numel, device=pool.device), torch.rand(numel, device=pool.device))]
    starts = range(0, pool.numel() - 2 * numel + 1, 2 * numel)
    return [(pool[o : o + numel], pool[o + numel : o + 2 * numel]) for o in starts[:_MAX_PAIRS]]


def _cycling(
    op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    phase: int = 0,
) -> Callable[[], torch.Tensor]:
    """``op`` on the next pair at each call, round the list, starting ``phase`` thirds
    of the way round: ops taking turns on one list do not read the pair another has
    just brought into the caches."""
    at = [phase * len(pairs) // 3 % len(pairs)]

    def run() -> torch.Tensor:
        a, b = pairs[at[0]]
        at[0] = (at[0] + 1) % len(pairs)
        return op(a, b)

    return run
