"""The calibration's fits recover the figures that made synthetic timings, with and without
noise (autoplan.calibrate.fit_links, autoplan.calibrate.fit_device)."""

from __future__ import annotations

import random

import pytest

from autoplan.calibrate.comm import CollectiveSample, message_bytes
from autoplan.calibrate.compute import ComputeSample
from autoplan.calibrate.fit_device import fit_device
from autoplan.calibrate.fit_links import fit_collectives, fit_link, round_sig
from autoplan.calibrate.settings import Settings
from autoplan.core.errors import PlanError
from autoplan.core.measured import OPS, LinkFit
from autoplan.core.topology import Device
from autoplan.cost.compute import roofline_us

TRUE = LinkFit(latency_us=300.0, step_us=150.0, busbw_gbps=0.6)
# the groups of a 2x2 mesh on one node: dp, tp (2 ranks each), dp+tp (4 ranks)
GROUPS = (("dp", 2), ("tp", 2), ("dp+tp", 4))
SIZES = Settings().comm_sizes()


def _samples(op: str, fit: LinkFit, noise: float, seed: int = 0) -> list[CollectiveSample]:
    rng = random.Random(seed)
    out = []
    for group, n in GROUPS:
        for size in SIZES:
            nbytes = message_bytes(size, n)
            t = fit.time_us(op, nbytes, n) * rng.lognormvariate(0.0, noise)
            out.append(CollectiveSample(op, group, "intra", n, nbytes, t))
    return out


@pytest.mark.parametrize("op", OPS)
def test_the_link_fit_recovers_exact_timings(op):
    """Noiseless timings of a known fit give that fit back (to the 4 digits written)."""
    fit = fit_link(op, _samples(op, TRUE, noise=0.0))
    assert fit.latency_us == pytest.approx(TRUE.latency_us, rel=1e-3)
    assert fit.step_us == pytest.approx(TRUE.step_us, rel=1e-3)
    assert fit.busbw_gbps == pytest.approx(TRUE.busbw_gbps, rel=1e-3)


@pytest.mark.parametrize("op", OPS)
def test_the_link_fit_recovers_noisy_timings(op):
    """With 10 % log-normal noise on every time the bandwidth and the fixed cost of a 2-
    and a 4-rank group come back within 10 % (the bandwidth rests on the 6 samples of the
    two largest sizes, whose mean noise is about 4 %)."""
    fit = fit_link(op, _samples(op, TRUE, noise=0.1, seed=OPS.index(op)))
    assert fit.busbw_gbps == pytest.approx(TRUE.busbw_gbps, rel=0.1)
    for n in (2, 4):
        fixed = fit.latency_us + fit.step_us * (n - 1)
        assert fixed == pytest.approx(TRUE.latency_us + TRUE.step_us * (n - 1), rel=0.1)


def test_one_group_size_fits_no_step():
    """A 1-D mesh's groups all have one size: the fixed cost is all latency, step 0."""
    samples = [s for s in _samples("all_reduce", TRUE, 0.0) if s.group == "dp+tp"]
    fit = fit_link("all_reduce", samples)
    assert fit.step_us == 0.0
    assert fit.latency_us == pytest.approx(TRUE.latency_us + 3 * TRUE.step_us, rel=1e-3)
    assert fit.busbw_gbps == pytest.approx(TRUE.busbw_gbps, rel=1e-3)


def test_fits_per_link_class_and_their_errors():
    """Each (link, op) with samples gets its own fit and an error entry; the error of a fit
    to noiseless timings is the rounding's only."""
    samples = _samples("all_gather", TRUE, 0.0)
    samples += [
        CollectiveSample("all_gather", s.group, "inter", s.ranks, s.nbytes, 3 * s.time_us)
        for s in samples
    ]
    fits, errors = fit_collectives(samples)
    assert [op for op, _ in fits.intra] == ["all_gather"] == [op for op, _ in fits.inter]
    assert fits.fit("all_gather", 2).busbw_gbps == pytest.approx(TRUE.busbw_gbps / 3, rel=1e-3)
    assert set(errors) == {"intra.all_gather", "inter.all_gather"}
    assert errors["intra.all_gather"].points == len(GROUPS) * len(SIZES)
    assert errors["intra.all_gather"].worst < 1e-3


def test_a_fit_without_a_bandwidth_term_is_refused():
    """Times that do not grow with the message size leave no bandwidth to fit: an error
    that says to measure larger messages."""
    flat = [
        CollectiveSample("all_reduce", g, "intra", n, message_bytes(s, n), 500.0)
        for g, n in GROUPS
        for s in SIZES
    ]
    with pytest.raises(
        PlanError, match=r"no time per byte: its largest message \(33554432 bytes\).*comm_max_bytes"
    ):
        fit_link("all_reduce", flat)


DEVICE = Device(
    name="synthetic",
    peak_bf16_tflops=0.2,
    peak_fp32_tflops=0.08,
    hbm_gbps=30.0,
    memory_gib=4.0,
    flops_efficiency=1.0,
    memory_efficiency=1.0,
    op_overhead_us=2.5,
    attention_efficiency=0.6,
    view_overhead_us=3.0,
)


def _compute_samples(device: Device, noise: float, seed: int = 0) -> list[ComputeSample]:
    rng = random.Random(seed)
    settings = Settings()
    shapes: list[tuple[str, str, str, float, float]] = [
        ("overhead", "add 1", "float32", 0, 12),
        ("overhead", "mul 1", "float32", 0, 12),
        ("overhead", "sum 1", "float32", 0, 8),
    ]
    for numel in settings.pointwise_numels:
        shapes += [
            ("pointwise", f"add {numel}", "float32", 0, 12 * numel),
            ("pointwise", f"mul {numel}", "float32", 0, 12 * numel),
            ("reduction", f"sum {numel}", "float32", 0, 4 * numel + 4),
        ]
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        for _, (m, k, n), _ in settings.matmul_shapes():
            nbytes = (m * k + k * n + m * n) * size
            shapes.append(("matmul", f"mm {m}x{k}x{n}", dtype, 2 * m * k * n, nbytes))
    for b, h, s, d in settings.attention_shapes():
        flops = 4 * b * h * s * s * d
        shapes.append(("attention", f"sdpa {s}x{d}", "float32", flops, 16 * b * h * s * d))
        shapes.append(
            ("attention", f"sdpa+bwd {s}x{d}", "float32", 3.5 * flops, 32 * b * h * s * d)
        )
    out = [
        ComputeSample(
            *s,
            roofline_us(device, s[3], s[4], s[2] != "float32", attention=s[0] == "attention")
            * noisy,
        )
        for s in shapes
        for noisy in [rng.lognormvariate(0.0, noise)]
    ]
    return out + [
        ComputeSample(
            "view", v, "float32", 0, 0, device.view_overhead_us * rng.lognormvariate(0.0, noise)
        )
        for v in ("view", "permute", "transpose")
    ]


def _large_flops() -> float:
    return min(2 * m * k * n for _, (m, k, n), big in Settings().matmul_shapes() if big)


def test_the_device_fit_recovers_exact_timings():
    """Noiseless roofline timings of a known device give it back: overhead, bandwidth,
    both peaks, the attention kernels' share of the peak and a view's cost; the
    efficiencies are 1 (the peaks are the measured ones)."""
    device, errors = fit_device(
        _compute_samples(DEVICE, 0.0), name="synthetic", memory_gib=4.0,
        large_flops=_large_flops(),
    )  # fmt: skip
    assert device == DEVICE
    assert set(errors) == {
        "overhead", "pointwise", "reduction", "matmul_fp32", "matmul_bf16", "attention", "view",
    }  # fmt: skip
    assert max(e.worst for e in errors.values()) < 1e-3


def test_a_device_whose_host_runs_ahead_prices_views_at_zero():
    """host_views=False (a GPU's calibration): the views measured on the host are not a
    cost of the device's step; without attention samples the efficiency stays 1."""
    samples = [s for s in _compute_samples(DEVICE, 0.0) if s.kind != "attention"]
    device, errors = fit_device(
        samples, name="synthetic", memory_gib=4.0, large_flops=_large_flops(), host_views=False
    )
    assert (device.view_overhead_us, device.attention_efficiency) == (0.0, 1.0)
    assert "view" not in errors and "attention" not in errors


def test_the_device_fit_recovers_noisy_timings():
    """With 5 % log-normal noise every figure comes back within 10 %."""
    device, errors = fit_device(
        _compute_samples(DEVICE, 0.05, seed=3), name="synthetic", memory_gib=4.0,
        large_flops=_large_flops(),
    )  # fmt: skip
    for field in (
        "op_overhead_us", "hbm_gbps", "peak_fp32_tflops", "peak_bf16_tflops",
        "attention_efficiency", "view_overhead_us",
    ):  # fmt: skip
        assert getattr(device, field) == pytest.approx(getattr(DEVICE, field), rel=0.1), field
    assert all(e.median < 0.1 for e in errors.values()), errors


def test_the_device_fit_needs_each_kind():
    """A sample set with no large bfloat16 matmul names what is missing."""
    samples = [s for s in _compute_samples(DEVICE, 0.0) if s.dtype != "bfloat16"]
    with pytest.raises(PlanError, match="No large bfloat16 matmul"):
        fit_device(samples, name="x", memory_gib=1.0, large_flops=_large_flops())


def test_round_sig_keeps_four_significant_digits():
    """The written figures keep 4 significant digits at any magnitude."""
    assert round_sig(0.000123456) == 0.0001235
    assert round_sig(123456.0) == 123500.0
    assert round_sig(0.0) == 0.0
