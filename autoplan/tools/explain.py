"""Explain one choice of a plan: what it costs and why the alternatives cost more.

Input: a :class:`~autoplan.tools.rebuild.Rebuilt` (the plan's problem, re-priced)
and a graph node name or a parameter FQN. Output: a dict (``--json``) and a
text report: the chosen strategy, its compute, the communication of its
inputs, its memory (parameters), and the next best alternatives, each with
its cost delta split into compute, communication and memory, and the edges
whose redistribution changed the most, with their collectives.

How an alternative is priced: the asked node takes the alternative strategy
and every other node keeps the plan's choice, so the delta is
``compute delta + sum of the incident edges' deltas``. When the planner merged
the node with its followers (``collapse_followers``) the node and its
followers move together, as they did in the ILP, and the delta covers the
whole group. On an exact solve no such move is cheaper than the plan: a
negative delta would be a better plan the solver missed. Two restrictions
can make one legitimately cheaper, and the report says when they apply:
layer tying (``cluster_layers``: the node's twins must move with it) and the
memory budget (the alternative is marked over budget).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import numpy as np

from autoplan.core.errors import PlanError
from autoplan.core.placements import fmt
from autoplan.cost.price import GRAD_SLOT, EdgeCost
from autoplan.strategies.constraints import resolve_pins
from autoplan.strategies.table import NodeStrategies, Strategy
from autoplan.tools.rebuild import Rebuilt

TOL_US = 1e-6


def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def resolve(rb: Rebuilt, name: str) -> tuple[str, str | None]:
    """(graph node, parameter FQN or None) for a node name or a parameter FQN."""
    by_fqn = dict(zip(rb.traced.param_fqns, rb.traced.params, strict=True))
    fqn_of = {v: k for k, v in by_fqn.items()}
    if name in by_fqn:
        return by_fqn[name], name
    if name in rb.table.nodes:
        return name, fqn_of.get(name)
    close = difflib.get_close_matches(name, list(by_fqn) + list(rb.table.nodes), n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise PlanError(
        f"{name!r} is neither a parameter nor a graph node of {rb.run.source} ({hint}); "
        "give a parameter FQN such as layers.0.attention.wq.weight or a node name from the "
        "plan JSON's node_placements."
    )


def _text(ns: NodeStrategies, s: Strategy) -> str:
    return fmt(s.outs[0]) if ns.kind in ("param", "input", "buffer", "tangent") else str(s)


def _moves(rb: Rebuilt, e: EdgeCost, assign: dict[str, int]) -> str:
    s = assign.get(e.src, rb.choice[e.src])
    d = assign.get(e.dst, rb.choice[e.dst])
    row, col = e.src_group[s], e.dst_group[d]
    src, dst = e.src_placements[row], e.dst_placements[col]
    if src == dst:
        return f"{fmt(src)}, no move"
    if not math.isfinite(e.cost[row, col]):
        return f"{fmt(src)} -> {fmt(dst)}: impossible"
    path = e.route(row, col)
    head = " -> ".join(fmt(p) for p in path)
    if e.tensor is None:
        return head
    names = rb.table.axis_names
    parts = [
        f"{kind} over {'x'.join(names[a] for a in axes)} {human_bytes(nbytes)}"
        for kind, axes, nbytes, _us in e.route_steps(rb.redist, row, col)
    ]
    return head + ": " + (", ".join(parts) if parts else "local slice, no comm")


def _label(e: EdgeCost, unit: set[str]) -> str:
    if e.slot == GRAD_SLOT:
        return f"gradient {e.src} -> {e.dst}"
    if e.dst in unit and e.src in unit:
        return f"inside {e.src} -> {e.dst}[{e.slot}]"
    if e.dst in unit:
        return f"input {e.src} -> {e.dst}[{e.slot}]"
    return f"consumer {e.src} -> {e.dst}[{e.slot}]"


def _unit_edges(rb: Rebuilt, members: list[str]) -> list[EdgeCost]:
    seen: dict[int, EdgeCost] = {}
    for v in members:
        for e in rb.in_edges.get(v, ()) + rb.out_edges.get(v, ()):
            seen.setdefault(id(e), e)
    return list(seen.values())


def _assign(rb: Rebuilt, members: list[str], i: int) -> dict[str, int]:
    out = {members[0]: i}
    for f in members[1:]:
        out[f] = int(rb.follow[f][i])
    return out


def _allowed(rb: Rebuilt, node: str) -> np.ndarray | None:
    """Strategies the run's constraints (inputs, outputs, pins) allow for a node, None if free."""
    outs = [s.outs[0] for s in rb.table.nodes[node].strategies]
    mask = np.ones(len(outs), dtype=bool)
    constrained = False
    inputs = list(rb.traced.inputs)
    if node in inputs and rb.run.input_placements:
        want = rb.run.input_placements[inputs.index(node)]
        mask &= np.array([o == want for o in outs])
        constrained = True
    outputs = list(rb.traced.outputs)
    if node in outputs and rb.run.output_placements:
        want = rb.run.output_placements[outputs.index(node)]
        mask &= np.array([o == want for o in outs])
        constrained = True
    pinned = resolve_pins(rb.traced, rb.table, rb.run.pins)
    if node in pinned:
        mask &= pinned[node]
        constrained = True
    return mask if constrained else None


def explain(rb: Rebuilt, name: str, *, top: int = 5) -> dict[str, Any]:
    """The chosen strategy of ``name`` and its ``top`` cheapest alternatives (see module doc)."""
    node, fqn = resolve(rb, name)
    ns = rb.table.nodes[node]
    root = rb.root[node]
    members = rb.members(root)
    unit = set(members)
    edges = _unit_edges(rb, members)
    chosen = {v: rb.choice[v] for v in members}
    memory = rb.costs.memory
    budget = rb.run.config.memory_budget_bytes
    total_memory = sum(float(memory[p][rb.choice[p]]) for p in memory)

    kept = rb.costs.activations

    def price(assign: dict[str, int]) -> tuple[float, list[float], float]:
        compute = sum(float(rb.costs.compute[v][assign[v]]) for v in members)
        per_edge = [rb.edge_us(e, assign) for e in edges]
        mem = sum(float(memory[v][assign[v]]) for v in members if v in memory)
        return compute, per_edge, mem

    def saved(assign: dict[str, int]) -> float:
        return sum(float(kept[v][assign[v]]) for v in members if v in kept)

    base_compute, base_edges, base_mem = price(chosen)
    base_saved = saved(chosen)
    chosen_key = tuple(
        _text(rb.table.nodes[v], rb.table.nodes[v].strategies[chosen[v]]) for v in members
    )
    allowed = _allowed(rb, root)
    alternatives, seen = [], {chosen_key}
    impossible = not_allowed = 0
    for i in range(len(rb.table.nodes[root].strategies)):
        assign = _assign(rb, members, i)
        key = tuple(
            _text(rb.table.nodes[v], rb.table.nodes[v].strategies[assign[v]]) for v in members
        )
        if key in seen:
            continue
        seen.add(key)
        if allowed is not None and not allowed[i]:
            not_allowed += 1
            continue
        compute, per_edge, mem = price(assign)
        if not np.isfinite(sum(per_edge)) or not np.isfinite(compute):
            impossible += 1
            continue
        deltas = [a - b for a, b in zip(per_edge, base_edges, strict=True)]
        comm_delta = sum(deltas)
        why = sorted(
            (k for k, d in enumerate(deltas) if abs(d) > TOL_US), key=lambda k: -abs(deltas[k])
        )
        alternatives.append(
            {
                "strategy": _text(ns, ns.strategies[assign[node]]),
                "delta_us": compute - base_compute + comm_delta,
                "compute_delta_us": compute - base_compute,
                "comm_delta_us": comm_delta,
                "memory_delta_bytes": mem - base_mem,
                "activation_delta_bytes": saved(assign) - base_saved,
                "over_budget": budget is not None and total_memory + mem - base_mem > budget,
                "edges": [
                    {
                        "edge": _label(edges[k], unit),
                        "delta_us": deltas[k],
                        "chosen": _moves(rb, edges[k], {}),
                        "alternative": _moves(rb, edges[k], assign),
                    }
                    for k in why
                ],
            }
        )
    alternatives.sort(key=lambda a: (a["delta_us"], a["strategy"]))
    compute_us, comm_us = rb.node_cost(node)
    return {
        "name": name,
        "node": node,
        "parameter": fqn,
        "op": ns.op,
        "strategy": _text(ns, ns.strategies[rb.choice[node]]),
        "compute_us": compute_us,
        "comm_us": comm_us,
        "memory_bytes": float(memory[node][rb.choice[node]]) if node in memory else None,
        "edges": [
            {"edge": _label(e, {node}), "us": rb.edge_us(e), "moves": _moves(rb, e, {})}
            for e in rb.in_edges.get(node, ()) + rb.out_edges.get(node, ())
        ],
        "moves_with": members if len(members) > 1 else [],
        "tied_to": rb.twin.get(root, root) if rb.twin.get(root, root) != root else None,
        "status": rb.plan.status,
        "num_alternatives": len(alternatives),
        "impossible": impossible,
        "not_allowed": not_allowed,
        "alternatives": alternatives[:top],
    }


def format_explain(result: dict[str, Any]) -> str:
    """The explanation as text, as ``autoplan explain`` prints it."""
    r = result
    what = (
        f"parameter {r['parameter']} (node {r['node']})" if r["parameter"] else f"node {r['node']}"
    )
    lines = [f"{what}: {r['op']}"]
    mem = (
        f"  memory {human_bytes(r['memory_bytes'])}/device" if r["memory_bytes"] is not None else ""
    )
    lines.append(
        f"chosen {r['strategy']}   compute {r['compute_us']:.2f} us   "
        f"input comm {r['comm_us']:.2f} us{mem}"
    )
    width = max((len(e["edge"]) for e in r["edges"]), default=0)
    for e in r["edges"]:
        lines.append(f"  {e['edge']:<{width}}  {e['us']:9.2f} us  {e['moves']}")
    if r["moves_with"]:
        lines.append(
            "moves with its merged group (collapse_followers): " + ", ".join(r["moves_with"])
        )
    if r["tied_to"]:
        lines.append(
            f"tied to twin {r['tied_to']} (cluster_layers): the solver moved twins together "
            "(untie_under_budget may split them after), this report moves one, so an "
            "alternative may be cheaper alone"
        )
    if r["status"] in ("time_limit", "node_limit"):
        limit = "time" if r["status"] == "time_limit" else "node"
        lines.append(f"the solver stopped at its {limit} limit: a cheaper alternative is possible")
    cheaper = [a for a in r["alternatives"] if a["delta_us"] < -TOL_US and not a["over_budget"]]
    if cheaper and not r["tied_to"] and r["status"] == "optimal":
        lines.append(
            f"{len(cheaper)} alternative(s) below are cheaper than the plan with nothing else "
            "restricting them: the solver missed a better plan (mip_gap or a bug; please report)"
        )
    skipped = []
    if r["impossible"]:
        skipped.append(f"{r['impossible']} impossible with the neighbours' placements")
    if r["not_allowed"]:
        skipped.append(f"{r['not_allowed']} excluded by the run file's placement constraints")
    extra = f" ({'; '.join(skipped)})" if skipped else ""
    if not r["alternatives"]:
        lines.append(f"no other strategy is possible with every other node fixed{extra}")
        return "\n".join(lines)
    lines.append(
        f"next best of {r['num_alternatives']} alternatives, every other node fixed{extra}:"
    )
    for a in r["alternatives"]:
        flag = "  OVER BUDGET" if a["over_budget"] else ""
        d = a["memory_delta_bytes"]
        mem = f"  memory {'+' if d > 0 else ''}{human_bytes(d)}" if d else ""
        k = a.get("activation_delta_bytes", 0.0)
        mem += f"  (saved activations {'+' if k > 0 else ''}{human_bytes(k)})" if k else ""
        lines.append(
            f"  {a['delta_us']:+10.2f} us  {a['strategy']:<28} compute {a['compute_delta_us']:+.2f}"
            f"  comm {a['comm_delta_us']:+.2f}{mem}{flag}"
        )
        for e in a["edges"][:3]:
            lines.append(
                f"      {e['delta_us']:+9.2f} us  {e['edge']}: now {e['alternative']}"
                f"  (was {e['chosen']})"
            )
    return "\n".join(lines)
