"""Fitting the collectives: one latency-step-bandwidth line per op and link class.

Stage: fitting, after :mod:`autoplan.calibrate.comm`.
Input: :class:`~autoplan.calibrate.comm.CollectiveSample` s.
Output: :class:`autoplan.core.measured.CollectiveFits` (figures rounded to 4 significant
digits, as the topology file holds them) and, per kind (``intra.all_reduce``), the fit's
:class:`FitError` on the samples it was fitted to.
Why this fit: the model is linear in its parameters, ``t = latency + step x (n - 1) +
(bytes x busfactor(op, n)) / busbw``, so non-negative least squares (scipy's ``nnls``)
on the columns (1, n - 1, bytes x busfactor) finds them; each row is divided by its
measured time, so the fit minimises the relative error and a 10 us message counts as
much as a 100 ms one. Groups of one size only (a 1-D mesh) cannot tell a latency from a
per-rank step: the step is then 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoplan.calibrate.comm import CollectiveSample
from autoplan.core.errors import PlanError
from autoplan.core.measured import LINKS, OPS, CollectiveFits, LinkFit, bus_factor

__all__ = ["FitError", "fit_collectives", "fit_link", "relative_errors", "round_sig"]

# The bytes of the largest message must explain this share of its time for the fit to
# read a bandwidth from them; below it, the bandwidth is noise (or unbounded).
_MIN_WIRE_SHARE = 0.05


@dataclass(frozen=True)
class FitError:
    """How far a fit's predictions are from the times it was fitted to."""

    median: float
    """Median of |predicted - measured| / measured."""
    worst: float
    """Largest of them."""
    points: int


def round_sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (a file a person reads)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> FitError:
    """The median and worst relative error of ``predicted`` against ``measured``."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    return FitError(statistics.median(errors), max(errors), len(errors))


def fit_link(op: str, samples: Sequence[CollectiveSample]) -> LinkFit:
    """The :class:`LinkFit` of ``op`` minimising the relative error over ``samples``."""
    from scipy.optimize import nnls  # scipy.optimize takes ~0.3 s to import

    t = np.array([s.time_us for s in samples], dtype=float)
    ranks = np.array([s.ranks for s in samples], dtype=float)
    wire = np.array([s.nbytes * bus_factor(op, s.ranks) for s in samples], dtype=float)
    columns = [np.ones_like(t), ranks - 1, wire]
    one_size = len(set(ranks.tolist())) == 1
    if one_size:
        columns.pop(1)
    a = np.column_stack(columns) / t[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, np.ones_like(t))
    coef = coef / scale
    latency, step, per_byte = (coef[0], 0.0, coef[1]) if one_size else tuple(coef)
    per_byte = float(per_byte)
    largest = int(np.argmax(wire))
    if per_byte * wire[largest] < _MIN_WIRE_SHARE * t[largest]:
        raise PlanError(
            f"The fit of {op} found no time per byte: its largest message "
            f"({samples[largest].nbytes} bytes) spends under {_MIN_WIRE_SHARE:.0%} of its "
            "time on the bytes. Measure larger messages (comm_max_bytes)."
        )
    return LinkFit(
        latency_us=round_sig(float(latency)),
        step_us=round_sig(float(step)),
        busbw_gbps=round_sig(1.0 / (float(per_byte) * 1e3)),  # us/byte -> GB/s
    )


def fit_collectives(
    samples: Sequence[CollectiveSample],
) -> tuple[CollectiveFits, dict[str, FitError]]:
    """A fit per (link class, op) that has samples, and each fit's error on them."""
    links: dict[str, list[tuple[str, LinkFit]]] = {}
    errors: dict[str, FitError] = {}
    for link in LINKS:
        for op in OPS:
            mine = [s for s in samples if s.link == link and s.op == op]
            if not mine:
                continue
            fit = fit_link(op, mine)
            links.setdefault(link, []).append((op, fit))
            predicted = [fit.time_us(op, s.nbytes, s.ranks) for s in mine]
            errors[f"{link}.{op}"] = relative_errors(predicted, [s.time_us for s in mine])
    return CollectiveFits(
        intra=tuple(links.get("intra", ())), inter=tuple(links.get("inter", ()))
    ), errors
