"""The comment heading a calibrated topology file: how it was measured and what it prices.

Stage: the step of :func:`autoplan.calibrate.run.measure` before writing
(:mod:`autoplan.calibrate.write`).
Input: the calibrated :class:`~autoplan.core.topology.Topology`, the
:class:`~autoplan.calibrate.settings.Settings` measured with, each fit's error, the job's
rank count and the output path.
Output: the header's lines, without the ``#``.
Why: a topology file outlives the job that measured it; a reader judges from the header
whether it still describes their cluster. Its link figures (``intra_node_gbps``,
``inter_node_gbps`` and the latencies) are not what prices a fitted collective: they feed
only the NCCL-style model of :mod:`autoplan.cost.collectives`, which prices the
collectives no fit covers. The header says which those are, so that a copied busbw is
not read as a second measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from autoplan.calibrate.fit_links import FitError
from autoplan.calibrate.settings import Settings
from autoplan.core.measured import LINKS, OPS
from autoplan.core.topology import Topology

__all__ = ["header_lines"]

_WHERE = {"intra": "inside a node", "inter": "across nodes"}
_FIELD = {"intra": "intra_node_gbps", "inter": "inter_node_gbps"}


def header_lines(
    topology: Topology,
    settings: Settings,
    errors: Mapping[str, FitError],
    world: int,
    out: str | Path | None,
) -> list[str]:
    """The lines of a calibrated topology file's header, first to last."""
    cal = topology.calibration
    assert cal is not None, "a calibrated topology records its calibration"
    mesh = " x ".join(f"{n}={k}" for n, k in zip(cal.names, cal.mesh, strict=True))
    nodes = world // topology.gpus_per_node
    fitted = ", ".join(
        f"{k} {100 * e.median:.1f} % / {100 * e.worst:.1f} %" for k, e in errors.items()
    )
    fits = topology.collectives
    fitted_ops = {
        link: [op for op, _ in getattr(fits, link)] if fits is not None else [] for link in LINKS
    }
    unmeasured = ["intra_node_latency_us", "inter_node_latency_us"]
    unmeasured += [_FIELD[link] for link in LINKS if not fitted_ops[link]]
    if topology.nvls:
        unmeasured.append("nvls")
    name = Path(out).name if out is not None else "FILE.yaml"
    return [
        f"autoplan topology measured by `autoplan calibrate` on {cal.date}",
        f"job: mesh {mesh}, {world} {cal.backend} ranks on {nodes} node{'s' * (nodes > 1)} "
        f"({topology.gpus_per_node} per node), {topology.device.name}, torch {cal.torch}",
        f"measured, every rank at once, the slowest rank's time, median over repeats: "
        f"{settings.describe()}",
        "model: a collective takes latency_us + step_us x (ranks - 1) + bytes x busfactor / "
        "busbw_gbps (nccl-tests' bytes and bus factor), per link class (intra: one node, "
        "inter: several) and op, plus collectives.sync_us (the wait for the last rank to "
        "arrive from compute); an op takes (max(FLOPs / peak, bytes / hbm_gbps) + "
        "op_overhead_us) x (1 + collectives.skew, the ranks' drift per us of compute), "
        "attention at attention_efficiency x peak, a view view_overhead_us",
        f"fit errors, relative, median / worst: {fitted}",
        _link_line(fitted_ops),
        f"not measured, kept from the h100 preset: {', '.join(unmeasured)}",
        f"use: `topology: {name}` in a run file, or `autoplan plan RUN.yaml --set topology={name}`",
    ]


def _link_line(fitted_ops: Mapping[str, list[str]]) -> str:
    """What the link figures are and the collectives they price: those no fit covers."""
    copies = [
        f"{_FIELD[link]} is a copy of the highest busbw_gbps fitted {_WHERE[link]}"
        for link in LINKS
        if fitted_ops[link]
    ]
    left = []
    for link in LINKS:
        missing = [op for op in OPS if op not in fitted_ops[link]]
        if len(missing) == len(OPS):
            left.append(f"every collective {_WHERE[link]}")
        elif missing:
            left.append(f"{', '.join(missing)} {_WHERE[link]}")
    priced = " and ".join(left) if left else "none: every collective has a fit"
    what = "; ".join(copies) + "; " if copies else ""
    return (
        f"link figures: {what}a fitted collective does not read them; they price, with the "
        f"NCCL-style model, only the collectives no fit covers ({priced})"
    )
