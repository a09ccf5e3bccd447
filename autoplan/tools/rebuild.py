"""Re-price a saved plan: the cheap stages again, and the plan's choice read back into them.

Input: a :class:`~autoplan.tools.runfile.Run` and the :class:`~autoplan.result.plan.Plan`
it made. Output: a frozen :class:`Rebuilt` holding the traced graph, the
strategy table, the cost table, the plan's chosen strategy index of every node
and the follower/tie structure the solver worked with.

Why: a plan JSON keeps placements and totals, not the model or the prices.
``explain`` and the per-kind chart need every node's price under every
strategy, so they run the stages before the solver again through
:func:`autoplan.planner.front_end.front_end`, the function the planner runs, and find each
node's chosen strategy by its placements in short form. A plan made from another
run file (mesh, model, options), or whose parameter placements disagree with its
nodes' (a file edited in one place), is refused with a message naming what differs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.core.placements import fmt, same
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.price import CostTable, EdgeCost
from autoplan.cost.redistribute import RedistributeModel
from autoplan.memory.recompute import checkpointed
from autoplan.planner.bucket_search import with_shared_launches
from autoplan.planner.front_end import front_end
from autoplan.planner.problem import PricedProblem
from autoplan.planner.solve_mode import planned_mode, structure
from autoplan.result.plan import Plan
from autoplan.result.records import NodePlacement
from autoplan.strategies.table import Strategy, StrategyTable
from autoplan.tools.run_plan import run_arguments
from autoplan.tools.runfile import Run
from autoplan.trace.capture import TracedGraph


class PlanMismatchError(PlanError):
    """The plan was not made from this run file; the message says what differs."""


@dataclass(frozen=True)
class Rebuilt:
    """The priced problem a plan solved, with the plan's choice in it.

    ``choice[v]`` is the index of v's chosen strategy; ``root[v]`` the node v
    was merged into by ``collapse_followers`` (v itself when not merged) and
    ``follow[v]`` the map root strategy -> v strategy; ``twin[v]`` the
    representative v's ILP variables were tied to (v itself when untied).
    """

    run: Run
    plan: Plan
    traced: TracedGraph
    table: StrategyTable
    costs: CostTable
    choice: dict[str, int]
    redist: RedistributeModel
    in_edges: dict[str, tuple[EdgeCost, ...]]
    out_edges: dict[str, tuple[EdgeCost, ...]]
    root: dict[str, str]
    follow: dict[str, np.ndarray]
    twin: dict[str, str]

    def members(self, root: str) -> list[str]:
        """The nodes that move with ``root`` in the ILP (itself first, then its followers)."""
        return [root] + [v for v, r in self.root.items() if r == root and v != root]

    def edge_us(self, e: EdgeCost, assign: dict[str, int] | None = None) -> float:
        """Price of edge ``e`` with ``assign`` overriding the plan's choice."""
        assign = assign or {}
        s = assign.get(e.src, self.choice[e.src])
        d = assign.get(e.dst, self.choice[e.dst])
        return float(e.cost[e.src_group[s], e.dst_group[d]])

    def node_cost(self, v: str) -> tuple[float, float]:
        """(compute, comm) microseconds of node v in the plan; comm = the moves of its inputs."""
        comm = sum(self.edge_us(e) for e in self.in_edges.get(v, ()))
        return float(self.costs.compute[v][self.choice[v]]), comm


def _yaml(value: object) -> str:
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _differences(run: Run, plan: Plan, model: nn.Module) -> list[str]:
    diffs = []
    if tuple(plan.mesh_shape) != run.mesh_shape or tuple(plan.axis_names) != run.axis_names:
        diffs.append(
            f"mesh: plan {list(plan.mesh_shape)} {list(plan.axis_names)}, "
            f"run file {list(run.mesh_shape)} {list(run.axis_names)}"
        )
    want = run.config.to_dict()
    for key in sorted(set(want) | set(plan.config)):
        a, b = plan.config.get(key), want.get(key)
        if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b)):
            where = "topology" if key == "topology" else f"plan.{key}"
            diffs.append(f"{where}: plan {a!r}, run file {b!r} (--set {where}={_yaml(a)})")
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if plan.param_shapes and shapes != {k: tuple(v) for k, v in plan.param_shapes.items()}:
        changed = sorted(
            k
            for k in set(shapes) | set(plan.param_shapes)
            if shapes.get(k) != plan.param_shapes.get(k)
        )
        diffs.append(
            f"model parameters differ, e.g. {changed[0]}: plan {plan.param_shapes.get(changed[0])}, run file {shapes.get(changed[0])}"
        )
    return diffs


def check_matches(run: Run, plan: Plan, plan_source: str, model: nn.Module) -> None:
    """Raise :class:`PlanMismatchError` unless ``plan`` was made from ``run`` (whose model,
    on the meta device, is ``model``)."""
    if plan.status == "infeasible":
        raise PlanMismatchError(
            f"{plan_source}: the plan is infeasible (no placements to explain); {plan.message}"
        )
    diffs = _differences(run, plan, model)
    if diffs:
        raise PlanMismatchError(
            f"{plan_source} was not made from {run.source}: "
            + "; ".join(diffs)
            + ". Pass the run file (and the same --set overrides) that made the plan."
        )


def _is_placed(s: Strategy, placed: NodePlacement) -> bool:
    """Whether strategy ``s`` is the one ``placed`` records."""
    return (
        len(s.outs) == len(placed.out)
        and len(s.ins) == len(placed.inputs)
        and all(map(same, s.outs + s.ins, placed.out + placed.inputs))
    )


def _read_choice(table: StrategyTable, plan: Plan, plan_source: str, run: Run) -> dict[str, int]:
    missing = sorted(set(table.nodes) - set(plan.node_placements))
    extra = sorted(set(plan.node_placements) - set(table.nodes))
    if missing or extra:
        raise PlanMismatchError(
            f"{plan_source} was not made from {run.source}: graph nodes differ "
            f"({len(missing)} only in the run, e.g. {missing[:3]}; {len(extra)} only in the plan, "
            f"e.g. {extra[:3]}). Pass the run file and --set overrides that made the plan."
        )
    choice = {}
    for v, ns in table.nodes.items():
        placed = plan.node_placements[v]
        hits = [i for i, s in enumerate(ns.strategies) if _is_placed(s, placed)]
        if not hits:
            raise PlanMismatchError(
                f"{plan_source}: node {v} has strategy ({', '.join(map(fmt, placed.inputs))}) -> "
                f"{', '.join(map(fmt, placed.out))}, which is not a candidate for it in {run.source}; "
                "the plan was made from another model, mesh or autoplan version."
            )
        choice[v] = hits[0]
    return choice


def _check_params(traced: TracedGraph, plan: Plan, plan_source: str, run: Run) -> None:
    """Refuse a plan whose ``param_placements`` disagree with its parameter nodes' placements:
    the choice is read from the nodes, so a file edited in one place only would be explained
    with a placement other than the one ``parallelize`` applies."""
    for fqn, node in zip(traced.param_fqns, traced.params, strict=True):
        held = plan.param_placements.get(fqn)
        placed = plan.node_placements[node].out
        if held is None or len(placed) != 1 or not same(held, placed[0]):
            outs = [fmt(p) for p in placed]
            said = "is missing" if held is None else f'= "{fmt(held)}"'
            raise PlanMismatchError(
                f'{plan_source}: param_placements["{fqn}"] {said} but the parameter\'s graph '
                f'node has node_placements["{node}"]["out"] = {json.dumps(outs)}: the file was '
                "edited in one place only. Give both the same placement, or re-plan with "
                f"`autoplan plan {run.source} --out {plan_source}`."
            )


def rebuild(run: Run, plan: Plan, *, plan_source: str = "plan") -> Rebuilt:
    """Prepare ``run`` again as the planner did (:func:`autoplan.planner.front_end.front_end`) and read
    ``plan``'s choice into it."""
    arguments = run_arguments(run)  # the model built once, for the check and the trace
    check_matches(run, plan, plan_source, arguments["model"])
    with front_end(**arguments) as problem:
        if plan.shared_launches:  # priced as the plan's solve was
            problem = with_shared_launches(problem, plan.shared_launches)
        return _read_back(run, plan, plan_source, problem)


def _read_back(run: Run, plan: Plan, plan_source: str, problem: PricedProblem) -> Rebuilt:
    """``plan``'s choice in ``problem``, priced with the plan's recomputation, and the
    groups and twins the solver had."""
    traced, table, config = problem.traced, problem.table, problem.config
    # the plan's recomputation priced and its kept activations counted, as planned
    costs, _ = checkpointed(
        traced, table, problem.costs, plan.recompute, counted=config.counts_activations
    )
    choice = _read_choice(table, plan, plan_source, run)
    _check_params(traced, plan, plan_source, run)
    in_edges: dict[str, list[EdgeCost]] = {}
    out_edges: dict[str, list[EdgeCost]] = {}
    for e in costs.edges:
        in_edges.setdefault(e.dst, []).append(e)
        out_edges.setdefault(e.src, []).append(e)
    # the groups and twins the solver had: its mode and reductions
    reduction, twin = structure(problem, planned_mode(config))
    root = {v: v for v in table.nodes}
    follow: dict[str, np.ndarray] = {}
    for v, (r, mapping) in reduction.roots.items():
        root[v], follow[v] = r, mapping
    return Rebuilt(
        run=run,
        plan=plan,
        traced=traced,
        table=table,
        costs=costs,
        choice=choice,
        redist=RedistributeModel(table.mesh_shape, CollectiveModel(config.topology)),
        in_edges={v: tuple(es) for v, es in in_edges.items()},
        out_edges={v: tuple(es) for v, es in out_edges.items()},
        root=root,
        follow=follow,
        twin=twin,
    )
