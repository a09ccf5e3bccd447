"""The table ``autoplan calibrate`` prints: each fitted figure and its error.

Stage: after :func:`autoplan.calibrate.run.measure`.
Input: a :class:`~autoplan.calibrate.run.Calibrated`.
Output: text, one row per kind: the fitted figures, then the median and worst relative
error of the model with them against the times they were fitted to.
Why: the errors say how far to trust the prices; a user reads them before planning.
"""

from __future__ import annotations

from autoplan.calibrate.run import Calibrated

__all__ = ["format_calibration"]

_DEVICE_FIGURES = {
    "overhead": "op_overhead_us {d.op_overhead_us:g}",
    "pointwise": "hbm_gbps {d.hbm_gbps:g}",
    "reduction": "hbm_gbps {d.hbm_gbps:g}",
    "matmul_fp32": "peak_fp32_tflops {d.peak_fp32_tflops:g}",
    "matmul_bf16": "peak_bf16_tflops {d.peak_bf16_tflops:g}",
    "attention": "attention_efficiency {d.attention_efficiency:g}",
    "view": "view_overhead_us {d.view_overhead_us:g}",
}


def format_calibration(result: Calibrated) -> str:
    """The fits and their errors as an aligned table."""
    topo = result.topology
    rows = [("kind", "fitted figures", "points", "median err", "worst err")]
    fits = topo.collectives
    for kind, error in result.errors.items():
        if kind in _DEVICE_FIGURES:
            figures = _DEVICE_FIGURES[kind].format(d=topo.device)
        else:
            link, op = kind.split(".")
            fit = fits.fit(op, 1 if link == "intra" else 2) if fits is not None else None
            assert fit is not None, kind
            figures = (
                f"latency_us {fit.latency_us:g}, step_us {fit.step_us:g}, "
                f"busbw_gbps {fit.busbw_gbps:g}"
            )
        rows.append(
            (kind, figures, str(error.points), f"{100 * error.median:.1f} %",
             f"{100 * error.worst:.1f} %")
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    fits = topo.collectives
    if result.sync and fits is not None:
        waits = ", ".join(f"{s.penalty_us:.0f}" for s in result.sync)
        lines.append(
            f"sync_us {fits.sync_us:.0f}, skew {fits.skew:.3g}: the wait of a collective after "
            f"compute ({waits} us after {', '.join(f'{s.burst_us:.0f}' for s in result.sync)} "
            "us of it, on each group)"
        )
    d = topo.device
    lines.append(f"device: {d.name}, memory_gib {d.memory_gib:g}")
    return "\n".join(lines)
