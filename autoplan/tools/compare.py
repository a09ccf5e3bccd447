"""Compare the einsum and native-mm solutions of one run, side by side.

Input: a :class:`~autoplan.tools.runfile.Run`. Output: a dict
``{"einsum": {...}, "native": {...}, "param_placement_diff": {...}}`` and a
text table of it. Both modes plan the same model on the same mesh; only
``PlanConfig.mm_mode`` differs. With ``by_kind=True`` each mode's plan is
re-priced (:mod:`autoplan.tools.rebuild`) and its compute and comm split per layer
kind (:mod:`autoplan.tools.chart`), for the PNG chart ``autoplan compare --out`` writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from autoplan.core import user_files
from autoplan.core.placements import fmt
from autoplan.result.plan import PHASES, Plan
from autoplan.result.records import MEMORY_CATEGORIES
from autoplan.tools.chart import cost_by_kind, write_chart
from autoplan.tools.rebuild import rebuild
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import Run

MODES = ("einsum", "native")


def _finite(value: float) -> float | None:
    """A cost, or None when the mode has none (an infeasible plan); JSON has no NaN."""
    return value if math.isfinite(value) else None


def _row(p: Plan) -> dict[str, Any]:
    return {
        "status": p.status,
        "objective_us": _finite(p.objective_us),
        "compute_us": _finite(p.compute_us),
        "comm_us": _finite(p.comm_us),
        "timings": dict(p.timings),
        "ilp_size": dict(p.ilp_size),
        "graph_nodes": p.graph_nodes,
        "mm_strategies_mean": p.stats.get("mm_strategies_mean", 0.0),
        "mm_strategies_max": p.stats.get("mm_strategies_max", 0.0),
        "strided_shard_chosen": int(p.stats.get("strided_shard_chosen", 0)),
        "memory_breakdown": dict(p.memory_breakdown),
        "checkpointing": sorted(set(p.checkpointing.values())),
        "message": p.message,
    }


def compare(run: Run, *, quiet: bool = False, by_kind: bool = False) -> dict[str, Any]:
    """Plan ``run`` in both mm modes; placements that differ are listed per parameter.
    Unless ``quiet``, each plan shows its phases on stderr.

    ``by_kind`` adds ``cost_by_kind`` (compute and comm per layer kind) to each
    feasible mode's row.
    """
    runs = {
        m: dataclasses.replace(run, config=dataclasses.replace(run.config, mm_mode=m))
        for m in MODES
    }
    plans = {m: run_plan(r, quiet=quiet) for m, r in runs.items()}
    out: dict[str, Any] = {m: _row(p) for m, p in plans.items()}
    if by_kind:
        for m, p in plans.items():
            if p.status != "infeasible":
                out[m]["cost_by_kind"] = cost_by_kind(rebuild(runs[m], p))
    diff = {}
    a, b = plans["einsum"].param_placements, plans["native"].param_placements
    for fqn in a:
        if fqn in b and a[fqn] != b[fqn]:
            diff[fqn] = {"einsum": fmt(a[fqn]), "native": fmt(b[fqn])}
    out["param_placement_diff"] = diff
    return out


def output_paths(out: str | Path) -> tuple[Path, Path]:
    """``--out``: a directory gets ``compare.json`` and ``compare.png``; a file
    ``X.json`` or ``X.png`` gets both ``X.json`` and ``X.png``."""
    path = Path(out)
    if path.is_dir() or str(out).endswith(("/", "\\")):
        return path / "compare.json", path / "compare.png"
    return path.with_suffix(".json"), path.with_suffix(".png")


def write_compare(result: dict[str, Any], out: str | Path, title: str) -> tuple[Path, Path]:
    """Write the comparison JSON and its per-kind chart, each whole or not at all
    (:func:`autoplan.core.user_files.replacing`); returns both paths."""
    json_path, png_path = output_paths(out)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    user_files.write_text(json_path, json.dumps(result, indent=1, sort_keys=True) + "\n")
    modes = {m: result[m]["cost_by_kind"] for m in MODES if "cost_by_kind" in result[m]}
    if modes:
        write_chart(modes, png_path, title)
    return json_path, png_path


MEMORY_ROWS = tuple((key, label) for key, _, label in MEMORY_CATEGORIES)


def _mib(value: float | None, breakdown: dict[str, float]) -> str:
    return f"{value / 2**20:.2f}" if breakdown and value is not None else "-"


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f}"


def format_compare(result: dict[str, Any]) -> str:
    """The comparison as an aligned text table."""
    e, n = result["einsum"], result["native"]
    rows: list[tuple[str, str, str]] = []
    for phase in PHASES:
        rows.append(
            (
                f"{phase} (s)",
                f"{e['timings'].get(phase, 0):.2f}",
                f"{n['timings'].get(phase, 0):.2f}",
            )
        )
    rows += [
        ("graph nodes", str(e["graph_nodes"]), str(n["graph_nodes"])),
        (
            "strategies per mm-like node (mean)",
            f"{e['mm_strategies_mean']:.1f}",
            f"{n['mm_strategies_mean']:.1f}",
        ),
        (
            "strategies per mm-like node (max)",
            f"{e['mm_strategies_max']:.0f}",
            f"{n['mm_strategies_max']:.0f}",
        ),
        ("ILP variables", str(e["ilp_size"].get("variables")), str(n["ilp_size"].get("variables"))),
        (
            "ILP constraints",
            str(e["ilp_size"].get("constraints")),
            str(n["ilp_size"].get("constraints")),
        ),
        ("status", e["status"], n["status"]),
        ("objective (ms)", _ms(e["objective_us"]), _ms(n["objective_us"])),
        ("  compute (ms)", _ms(e["compute_us"]), _ms(n["compute_us"])),
        ("  comm (ms)", _ms(e["comm_us"]), _ms(n["comm_us"])),
        (
            "chosen _StridedShard strategies",
            str(e["strided_shard_chosen"]),
            str(n["strided_shard_chosen"]),
        ),
        (
            "activation checkpointing",
            ", ".join(e.get("checkpointing", ())) or "-",
            ", ".join(n.get("checkpointing", ())) or "-",
        ),
    ]
    eb, nb = e.get("memory_breakdown") or {}, n.get("memory_breakdown") or {}
    if eb or nb:
        rows.append(
            ("memory per device (MiB)", _mib(sum(eb.values()), eb), _mib(sum(nb.values()), nb))
        )
        for key, label in MEMORY_ROWS:
            rows.append((f"  {label}", _mib(eb.get(key), eb), _mib(nb.get(key), nb)))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':<{width}}  {'einsum':>12}  {'native':>12}"]
    lines += [f"{k:<{width}}  {a:>12}  {b:>12}" for k, a, b in rows]
    if e["objective_us"] and n["objective_us"] is not None:
        lines.append(
            f"{'objective native/einsum':<{width}}  {n['objective_us'] / e['objective_us']:>27.3f}"
        )
    if "cost_by_kind" in e and "cost_by_kind" in n:
        lines.append("compute + comm per layer kind (ms):")
        for kind in e["cost_by_kind"]:
            a, b = e["cost_by_kind"][kind], n["cost_by_kind"][kind]
            lines.append(
                f"  {kind:<{width - 2}}  {a['compute_us'] / 1e3:>5.2f} + {a['comm_us'] / 1e3:<5.2f}"
                f"  {b['compute_us'] / 1e3:>5.2f} + {b['comm_us'] / 1e3:<5.2f}"
            )
    for mode in MODES:  # an infeasible mode says why
        if result[mode]["status"] == "infeasible" and result[mode].get("message"):
            lines.append(f"{mode}: {result[mode]['message']}")
    diff = result["param_placement_diff"]
    lines.append(f"parameters placed differently: {len(diff)}")
    for fqn, d in list(diff.items())[:20]:
        lines.append(f"  {fqn:<40} einsum {d['einsum']:<12} native {d['native']}")
    if len(diff) > 20:
        lines.append(f"  ... and {len(diff) - 20} more")
    return "\n".join(lines)
