"""Stage 6, read out: a solved strategy per node -> the fields of a Plan.

Input: the traced graph, the strategy table, the cost table, the run's config,
the chosen strategy of every node and the solver's status. Output: a
:class:`~autoplan.result.plan.Plan` with its objective re-priced from the cost table
(the solver's own value is not trusted), the collectives per kind that the
chosen moves run along their routes, the routes that are more than one move,
every node's placements and strategy statistics.

Why its own stage: it reads the cost model (routes, priced steps) after the
solve, where the planner only sequences the stages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.core.config import PlanConfig
from autoplan.core.placements import Placements
from autoplan.cost.buckets import merged_moves, plan_buckets, tail_buckets
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.compute import ComputeModel
from autoplan.cost.price import CostTable, EdgeCost, state_copies
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.shared_launch import SharedLaunch
from autoplan.memory.activations import backward_peak, cotangent_memory
from autoplan.memory.recompute import stepped_moves
from autoplan.result.plan import Plan
from autoplan.result.records import Bucket, CommTotal, NodePlacement, Slot
from autoplan.strategies.ops import MM_FAMILY, has_strided
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

MM_LIKE = frozenset({"aten.einsum"} | {str(op).rsplit(".", 1)[0] for op in MM_FAMILY})


def _stats(table: StrategyTable, choice: dict[str, int]) -> dict[str, float]:
    """Strategies per mm-like node and how many chosen strategies use _StridedShard."""
    mm_like = [
        len(ns.strategies) for ns in table.nodes.values() if ns.op.rsplit(".", 1)[0] in MM_LIKE
    ]
    strided = sum(1 for v, i in choice.items() if has_strided(table.nodes[v].strategies[i]))
    return {
        "mm_nodes": float(len(mm_like)),
        "mm_strategies_mean": float(np.mean(mm_like)) if mm_like else 0.0,
        "mm_strategies_max": float(max(mm_like)) if mm_like else 0.0,
        "strided_shard_chosen": float(strided),
        "strategies_total": float(table.num_strategies),
    }


def read_solution(
    traced: TracedGraph,
    table: StrategyTable,
    costs: CostTable,
    config: PlanConfig,
    choice: dict[str, int],
    status: str,
    base: dict[str, Any],
    *,
    stepped: TracedGraph | None = None,
    launch: SharedLaunch | None = None,
) -> Plan:
    """The :class:`~autoplan.result.plan.Plan` of ``choice`` (a strategy per node): its
    objective re-priced from ``costs``, the collectives of every move along its route,
    the routes that are not one move, every node's placements and the stats.
    ``stepped`` is the graph the applied module runs (with its recomputations,
    :func:`autoplan.memory.recompute.with_recompute`), whose backward's peak is reported.
    ``launch`` says which moves ``costs`` charged a share of their bucket's launch
    (:mod:`autoplan.cost.shared_launch`): their collectives are reported as charged."""
    charged = launch.steps if launch is not None else None
    compute_us = sum(float(costs.compute[v][i]) for v, i in choice.items())
    redist = RedistributeModel(table.mesh_shape, CollectiveModel(config.topology))
    comm_us = 0.0
    totals: dict[str, list[float]] = {}  # kind -> count, bytes, us
    routes: dict[Slot, tuple[Placements, ...]] = {}
    for e in costs.edges:
        r = e.src_group[choice[e.src]]
        c = e.dst_group[choice[e.dst]]
        us = float(e.cost[r, c])
        comm_us += us
        if us == 0.0 or e.tensor is None:
            continue
        path = e.route(r, c)
        if len(path) > 2:
            routes[Slot(e.dst, e.slot)] = tuple(path[1:-1])
        for kind, _axes, nbytes, t in (charged or EdgeCost.route_steps)(e, redist, r, c):
            entry = totals.setdefault(kind, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += nbytes
            entry[2] += t
    comm = {kind: CommTotal(int(n), nbytes, us) for kind, (n, nbytes, us) in totals.items()}
    node_placements = {}
    for v, i in choice.items():
        ns = table.nodes[v]
        s = ns.strategies[i]
        node_placements[v] = NodePlacement(ns.op, tuple(s.outs), tuple(s.ins))
    params = {
        fqn: table.nodes[pname].strategies[choice[pname]].outs[0]
        for fqn, pname in zip(traced.param_fqns, traced.params, strict=True)
    }
    memory = sum(float(costs.memory[p][choice[p]]) for p in costs.memory)
    breakdown = dict.fromkeys(("parameters", "gradients", "optimizer"), 0.0)
    for fqn, p in zip(traced.param_fqns, traced.params, strict=True):
        if p not in costs.memory:
            continue
        copies = state_copies(fqn, traced, config.optimizer_states)
        per_tensor = float(costs.memory[p][choice[p]]) / copies  # parameter, gradient, k states
        breakdown["parameters"] += per_tensor
        if fqn not in traced.frozen:
            breakdown["gradients"] += per_tensor
            breakdown["optimizer"] += per_tensor * config.optimizer_states
    breakdown["activations"] = sum(float(a[choice[v]]) for v, a in costs.activations.items())
    breakdown["output_grad"] = sum(
        float(a[choice[v]]) for v, a in cotangent_memory(traced, table).items()
    )
    step = stepped or traced
    moved, moved_choice = stepped_moves(costs, choice, base.get("recompute", ()))
    merged = merged_moves(step, moved, redist, moved_choice, config.bucket_mib * 2**20, charged)
    tail = tail_buckets(merged, moved, table.mesh_shape)
    backward, returned = backward_peak(step, table, moved_choice, tail)
    breakdown["transient"] = max(0.0, backward - returned)  # what the backward adds at its peak
    base = base | {
        "param_placements": params,
        "node_placements": node_placements,
        "stats": _stats(table, choice),
        "routes": routes,
        "buckets": [
            Bucket(**b)
            for b in plan_buckets(
                merged, redist, ComputeModel.of(config.topology, table.mesh_shape)
            )
        ],
    }
    return Plan(
        status=status,
        objective_us=compute_us + comm_us,
        compute_us=compute_us,
        comm_us=comm_us,
        comm=comm,
        memory_bytes=memory,
        memory_breakdown=breakdown,
        **base,
    )
