"""Fitting the device: per-op overhead, memory bandwidth, the two matmul peaks, the
attention kernels' share of the peak and a view's dispatch.

Stage: fitting, after :mod:`autoplan.calibrate.compute`.
Input: :class:`~autoplan.calibrate.compute.ComputeSample` s, the device's name and memory.
Output: a :class:`autoplan.core.topology.Device` of measured figures (efficiencies 1:
the peaks are the ones reached) and, per kind (``overhead``, ``pointwise``,
``reduction``, ``matmul_fp32``, ``matmul_bf16``), the :class:`FitError` of the compute
model's roofline with that device on the samples.
Why in this order: each figure is read where it dominates. The overhead is the median
time of a tiny op; the bandwidth is the median of ``bytes / (t - overhead)`` over the
pointwise ops that take at least 4x the overhead (bound by their bytes); a dtype's peak is
the median of ``FLOPs / (t - overhead)`` over the large matmuls; the attention
efficiency the median of ``FLOPs / (t - overhead)`` over the attention samples, as a share
of their dtype's peak; a view's cost the median time of a view (0 when ``host_views`` is
false: a GPU's host dispatches ahead of the device). Medians, not least
squares: a few descheduled samples on a shared machine move a least-squares fit far, and
a median not at all. The errors then hold the roofline of
:mod:`autoplan.cost.compute` against every op measured, small matmuls and reductions
included, which no figure was fitted to.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from autoplan.calibrate.compute import ComputeSample
from autoplan.calibrate.fit_links import FitError, relative_errors, round_sig
from autoplan.core.errors import PlanError
from autoplan.core.topology import Device
from autoplan.cost.compute import roofline_us

__all__ = ["fit_device"]

# A pointwise op that takes this many times the per-op overhead is bound by its bytes.
_BYTES_BOUND = 4
_PEAK_FIELDS = {"float32": "peak_fp32_tflops", "bfloat16": "peak_bf16_tflops"}
_ERROR_KINDS = {"float32": "matmul_fp32", "bfloat16": "matmul_bf16"}


def fit_device(
    samples: Sequence[ComputeSample],
    *,
    name: str,
    memory_gib: float,
    large_flops: float,
    host_views: bool = True,
) -> tuple[Device, dict[str, FitError]]:
    """The device the samples show; a matmul of at least ``large_flops`` FLOPs is large.
    Attention and view samples are optional (without them: efficiency 1, views free)."""
    of = {k: [s for s in samples if s.kind == k] for k in ("overhead", "pointwise", "reduction")}
    for kind, mine in of.items():
        if not mine:
            raise PlanError(f"No {kind} op was measured; a device fit needs them.")
    overhead = statistics.median(s.time_us for s in of["overhead"])
    bandwidths = [
        s.nbytes / (s.time_us - overhead)
        for s in of["pointwise"]
        if s.time_us >= _BYTES_BOUND * overhead
    ]
    if not bandwidths:
        raise PlanError(
            f"No pointwise op took {_BYTES_BOUND}x the per-op overhead ({overhead:.3g} us): "
            "measure larger ones (pointwise_numels)."
        )
    peaks = {}
    for dtype, field in _PEAK_FIELDS.items():
        rates = [
            s.flops / (s.time_us - overhead)
            for s in samples
            if s.kind == "matmul" and s.dtype == dtype and s.flops >= large_flops
            and s.time_us > overhead
        ]  # fmt: skip
        if not rates:
            raise PlanError(f"No large {dtype} matmul was measured; the {field} fit needs one.")
        peaks[field] = round_sig(statistics.median(rates) / 1e6)  # FLOP/us -> TFLOP/s
    attention = [s for s in samples if s.kind == "attention" and s.time_us > overhead]
    efficiency = 1.0
    if attention:
        rates = [
            s.flops / (s.time_us - overhead) / (peaks[_PEAK_FIELDS[s.dtype]] * 1e6)
            for s in attention
        ]
        efficiency = round_sig(statistics.median(rates))
    views = [s.time_us for s in samples if s.kind == "view"]
    device = Device(
        name=name,
        attention_efficiency=efficiency,
        view_overhead_us=round_sig(statistics.median(views)) if views and host_views else 0.0,
        hbm_gbps=round_sig(statistics.median(bandwidths) / 1e3),  # B/us -> GB/s
        memory_gib=round_sig(memory_gib),
        flops_efficiency=1.0,
        memory_efficiency=1.0,
        op_overhead_us=round_sig(overhead),
        **peaks,
    )
    errors = {}
    for kind in ("overhead", "pointwise", "reduction"):
        errors[kind] = _errors(device, of[kind])
    for dtype, kind in _ERROR_KINDS.items():
        errors[kind] = _errors(
            device, [s for s in samples if s.kind == "matmul" and s.dtype == dtype]
        )
    if attention:
        errors["attention"] = _errors(device, attention, attention=True)
    if views and host_views:
        errors["view"] = relative_errors([device.view_overhead_us] * len(views), views)
    return device, errors


def _errors(
    device: Device, samples: Sequence[ComputeSample], *, attention: bool = False
) -> FitError:
    predicted = [
        roofline_us(device, s.flops, s.nbytes, s.dtype != "float32", attention=attention)
        for s in samples
    ]
    return relative_errors(predicted, [s.time_us for s in samples])
