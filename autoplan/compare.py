"""Compare the einsum and native-mm solutions of one run, side by side.

Input: a :class:`~autoplan.runfile.Run`. Output: a dict
``{"einsum": {...}, "native": {...}, "param_placement_diff": {...}}`` and a
text table of it. Both modes plan the same model on the same mesh; only
``PlanConfig.mm_mode`` differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from autoplan.placements import fmt
from autoplan.plan import PHASES, Plan
from autoplan.runfile import Run

MODES = ("einsum", "native")


def _row(p: Plan) -> dict[str, Any]:
    return {
        "status": p.status,
        "objective_us": p.objective_us,
        "compute_us": p.compute_us,
        "comm_us": p.comm_us,
        "timings": dict(p.timings),
        "ilp_size": dict(p.ilp_size),
        "graph_nodes": p.graph_nodes,
        "mm_strategies_mean": p.stats.get("mm_strategies_mean", 0.0),
        "mm_strategies_max": p.stats.get("mm_strategies_max", 0.0),
        "strided_shard_chosen": int(p.stats.get("strided_shard_chosen", 0)),
    }


def compare(run: Run, *, run_plan: Callable[[Run], Plan]) -> dict[str, Any]:
    """Plan ``run`` in both mm modes; placements that differ are listed per parameter."""
    plans = {
        m: run_plan(dataclasses.replace(run, config=dataclasses.replace(run.config, mm_mode=m)))
        for m in MODES
    }
    out: dict[str, Any] = {m: _row(p) for m, p in plans.items()}
    diff = {}
    a, b = plans["einsum"].param_placements, plans["native"].param_placements
    for fqn in a:
        if fqn in b and a[fqn] != b[fqn]:
            diff[fqn] = {"einsum": fmt(a[fqn]), "native": fmt(b[fqn])}
    out["param_placement_diff"] = diff
    return out


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
        ("objective (ms)", f"{e['objective_us'] / 1e3:.2f}", f"{n['objective_us'] / 1e3:.2f}"),
        ("  compute (ms)", f"{e['compute_us'] / 1e3:.2f}", f"{n['compute_us'] / 1e3:.2f}"),
        ("  comm (ms)", f"{e['comm_us'] / 1e3:.2f}", f"{n['comm_us'] / 1e3:.2f}"),
        (
            "chosen _StridedShard strategies",
            str(e["strided_shard_chosen"]),
            str(n["strided_shard_chosen"]),
        ),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':<{width}}  {'einsum':>12}  {'native':>12}"]
    lines += [f"{k:<{width}}  {a:>12}  {b:>12}" for k, a, b in rows]
    if e["objective_us"] and e["objective_us"] == e["objective_us"]:
        lines.append(
            f"{'objective native/einsum':<{width}}  {n['objective_us'] / e['objective_us']:>27.3f}"
        )
    diff = result["param_placement_diff"]
    lines.append(f"parameters placed differently: {len(diff)}")
    for fqn, d in list(diff.items())[:20]:
        lines.append(f"  {fqn:<40} einsum {d['einsum']:<12} native {d['native']}")
    if len(diff) > 20:
        lines.append(f"  ... and {len(diff) - 20} more")
    return "\n".join(lines)
