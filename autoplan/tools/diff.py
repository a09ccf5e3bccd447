"""Diff two saved plans: what changed in cost and in placements.

Stage: after planning, for reading (``autoplan diff A.json B.json``).
Input: two :class:`~autoplan.result.plan.Plan` objects, e.g. from ``Plan.load``.
Output: a JSON-ready dict (:func:`diff_plans`) and a text report of it
(:func:`format_diff`).
Why: planning the same model under two settings (a memory budget, another
mesh, ``mm_mode``) is how people learn what a knob does; the diff says how
the estimated step moved and which parameters and graph nodes were placed
differently, without eyeballing two summaries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from autoplan.core.placements import fmt
from autoplan.result.plan import Plan, param_kind

NUM_NODES_SHOWN = 20
"""How many changed graph nodes the report lists by name."""


def _mesh(p: Plan) -> str:
    return " x ".join(f"{n}={s}" for n, s in zip(p.axis_names, p.mesh_shape, strict=True))


def _outs(p: Plan, node: str) -> str:
    """A node's chosen output placements in short form, ``-`` when absent."""
    info = p.node_placements.get(node)
    if info is None:
        return "-"
    return ", ".join(fmt(o) for o in info.out)


def diff_plans(a: Plan, b: Plan) -> dict[str, Any]:
    """Cost deltas (B minus A) and the parameters and nodes placed differently.

    Keys: ``objective_us``, ``compute_us``, ``comm_us`` (each
    ``{"a", "b", "delta"}``), ``params`` (``[{"fqn", "a", "b"}]`` for FQNs
    both plans place, differently), ``params_by_kind`` (changed count per
    :func:`~autoplan.result.plan.param_kind`), ``nodes_changed`` (nodes whose output
    placements differ or that exist in one plan only), ``nodes`` (the first
    :data:`NUM_NODES_SHOWN` of them as ``{"node", "a", "b"}``) and
    ``warnings`` (the plans are not for the same mesh, parameters or status).
    """
    costs = {
        key: {
            "a": getattr(a, key),
            "b": getattr(b, key),
            "delta": getattr(b, key) - getattr(a, key),
        }
        for key in ("objective_us", "compute_us", "comm_us")
    }
    params = [
        {"fqn": fqn, "a": fmt(pa), "b": fmt(b.param_placements[fqn])}
        for fqn, pa in a.param_placements.items()
        if fqn in b.param_placements and fmt(pa) != fmt(b.param_placements[fqn])
    ]
    by_kind = Counter(param_kind(p["fqn"]) for p in params)
    node_names = list(a.node_placements) + [
        n for n in b.node_placements if n not in a.node_placements
    ]
    nodes = [
        {"node": n, "a": _outs(a, n), "b": _outs(b, n)}
        for n in node_names
        if _outs(a, n) != _outs(b, n)
    ]

    warnings = []
    if (a.mesh_shape, a.axis_names) != (b.mesh_shape, b.axis_names):
        warnings.append(f"different meshes: A {_mesh(a)}, B {_mesh(b)}")
    only_a = set(a.param_placements) - set(b.param_placements)
    only_b = set(b.param_placements) - set(a.param_placements)
    if only_a or only_b:
        warnings.append(
            f"different parameter sets: {len(only_a)} only in A, {len(only_b)} only in B"
            f" (e.g. {sorted(only_a | only_b)[0]}); only shared parameters are compared"
        )
    for name, p in (("A", a), ("B", b)):
        if p.status == "infeasible":
            warnings.append(f"plan {name} is infeasible; its times and placements are empty")
    return {
        **costs,
        "params": params,
        "params_by_kind": dict(by_kind),
        "nodes_changed": len(nodes),
        "nodes": nodes[:NUM_NODES_SHOWN],
        "warnings": warnings,
    }


def _cost_line(label: str, c: dict[str, float]) -> str:
    pct = f"{100 * c['delta'] / c['a']:+.1f}%" if c["a"] else "n/a"
    return (
        f"{label:<10} A {c['a'] / 1e3:9.3f} ms   B {c['b'] / 1e3:9.3f} ms"
        f"   delta {c['delta'] / 1e3:+9.3f} ms ({pct})"
    )


def format_diff(d: dict[str, Any]) -> str:
    """The :func:`diff_plans` dict as a short text report."""
    lines = [f"warning: {w}" for w in d["warnings"]]
    lines.append(_cost_line("objective", d["objective_us"]))
    lines.append(_cost_line("compute", d["compute_us"]))
    lines.append(_cost_line("comm", d["comm_us"]))
    lines.append(f"parameters placed differently: {len(d['params'])}")
    for p in d["params"]:
        lines.append(f"  {p['fqn']:<40} A {p['a']:<12} B {p['b']}")
    if d["params_by_kind"]:
        lines.append("  by kind: " + ", ".join(f"{k} x{n}" for k, n in d["params_by_kind"].items()))
    lines.append(f"graph nodes with different output placements: {d['nodes_changed']}")
    for n in d["nodes"]:
        lines.append(f"  {n['node']:<40} A {n['a']:<12} B {n['b']}")
    if d["nodes_changed"] > len(d["nodes"]):
        lines.append(f"  ... and {d['nodes_changed'] - len(d['nodes'])} more")
    return "\n".join(lines)
