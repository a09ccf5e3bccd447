"""The pipeline in one call: trace -> rewrite -> strategies -> cost -> ILP -> Plan.

Input: an ``nn.Module`` (meta device is fine), a function returning global
example inputs, a ``DeviceMesh`` (``autoplan.fake_mesh`` for planning) and a
:class:`~autoplan.config.PlanConfig`. Output: a :class:`~autoplan.plan.Plan`.
Each stage is timed; a progress callback hears the start of each phase.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from torch import nn
from torch.distributed.tensor import Placement

from autoplan.config import PlanConfig
from autoplan.constraints import PinSpec, resolve_pins, untie
from autoplan.cost.activations import activation_memory
from autoplan.cost.price import CostTable, price
from autoplan.graph import fingerprint
from autoplan.ilp.build import build_ilp
from autoplan.ilp.cluster import cluster
from autoplan.ilp.problem import InfeasibleError, plain_size
from autoplan.ilp.reduce import collapse_followers
from autoplan.ilp.untie import solve_untying
from autoplan.job import plan_on_one_rank
from autoplan.placements import Placements, fmt, parse
from autoplan.plan import Plan
from autoplan.readout import read_solution
from autoplan.recompute import layer_names, priced_recompute, recompute_set, with_recompute
from autoplan.rewrite import rewrite
from autoplan.strategies.dtensor import DeviceMesh
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.strategies.table import StrategyTable
from autoplan.trace import LossFn, TracedGraph, trace_joint

Progress = Callable[[str], None]
PlacementSpec = Sequence[Any] | str
# one placement for every input, one per input, or one per keyword of input_fn's dict
InputPlacements = PlacementSpec | Sequence[PlacementSpec] | Mapping[str, PlacementSpec]


def _as_placements(spec: PlacementSpec, num_axes: int, what: str) -> Placements:
    if isinstance(spec, str):
        return parse(spec, num_axes)
    placements = tuple(spec)
    if len(placements) != num_axes:
        raise ValueError(
            f"{what} {fmt(placements)} has {len(placements)} entries; the mesh has {num_axes} axes."
        )
    return placements


def _constrain(
    table: StrategyTable,
    names: Sequence[str],
    specs: Sequence[PlacementSpec] | None,
    what: str,
) -> dict[str, np.ndarray]:
    allowed: dict[str, np.ndarray] = {}
    if specs is None:
        return allowed
    if len(specs) != len(names):
        raise ValueError(
            f"{what} lists {len(specs)} placements but the model has {len(names)}; give one per {what.removesuffix('_placements')}."
        )
    num_axes = len(table.mesh_shape)
    for i, (name, spec) in enumerate(zip(names, specs, strict=True)):
        if spec is None:
            continue
        want = _as_placements(spec, num_axes, f"{what}[{i}]")
        ns = table.nodes[name]
        mask = np.array([s.outs[0] == want for s in ns.strategies])
        if not mask.any():
            shape = ns.out_tensors[0].shape if ns.out_tensors[0] else "?"
            raise ValueError(
                f"{what}[{i}] = {fmt(want)} is not possible for a tensor of shape {shape} on mesh "
                f"{table.mesh_shape}: a sharded dim must divide evenly by the mesh axes sharding it."
            )
        allowed[name] = mask
    return allowed


def _inputs_by_key(
    specs: InputPlacements | None,
    keys: Sequence[int | str],
) -> Sequence[PlacementSpec] | None:
    """``input_placements`` as one entry per input in the graph's order (``None``: left to
    the solver). One placement (``"S(0)R"``) places every input alike, the batch split the
    same way for the token ids and their labels; a dict is keyed like ``input_fn``'s."""
    if isinstance(specs, str) or (
        isinstance(specs, Sequence) and specs and all(isinstance(p, Placement) for p in specs)
    ):
        return [specs] * len(keys)
    if not isinstance(specs, Mapping):
        return specs
    unknown = [k for k in specs if k not in keys]
    if unknown:
        known = ", ".join(repr(k) for k in keys if isinstance(k, str)) or "none (positional)"
        raise ValueError(
            f"input_placements names input {unknown[0]!r}, which input_fn does not return "
            f"(its keyword inputs: {known}); key the dict by input_fn's keys."
        )
    return [specs.get(k) for k in keys]


def _scalars_replicated(traced: TracedGraph, num_axes: int) -> list[PlacementSpec | None]:
    """Every 0-dim output (a loss) replicated, the others free: each rank reads the loss
    it logs and steps on whole, never a partial sum."""
    return [
        "R" * num_axes if traced.node(n).meta["val"].ndim == 0 else None for n in traced.outputs
    ]


def _min_memory(costs: CostTable, allowed: dict[str, np.ndarray]) -> float:
    total = 0.0
    for p, mem in costs.memory.items():
        ok = allowed.get(p, np.ones(len(mem), dtype=bool))
        total += float(mem[ok].min())
    return total


def _timed(timings: dict[str, float], phase: str, progress: Progress | None) -> Callable[[], None]:
    if progress is not None:
        progress(phase)
    start = time.perf_counter()

    def done() -> None:
        timings[phase] = time.perf_counter() - start

    return done


def plan(
    model: nn.Module,
    input_fn: Callable[[], Any],
    mesh: DeviceMesh,
    *,
    config: PlanConfig | None = None,
    input_placements: InputPlacements | None = None,
    output_placements: Sequence[PlacementSpec] | None = None,
    loss_fn: LossFn | None = None,
    pins: Mapping[str, PinSpec] | None = None,
    progress: Progress | None = None,
    broadcast_from: int | None = None,
) -> Plan:
    """Find the cheapest sharding of ``model`` on ``mesh``.

    ``mesh`` is a planning mesh (:func:`autoplan.fake_mesh`) or, inside a job, the job's
    own mesh: planning reads its shape and names and runs no collective. With
    ``broadcast_from=r`` only rank ``r`` plans and every rank of the job receives its
    plan (:mod:`autoplan.job`); without, each process plans for itself (deterministic,
    unless a solver time limit cuts a solve short).

    ``input_fn`` returns the global example inputs: a tensor, a tuple of tensors, or a
    dict of keyword tensors (``{"input_ids": ..., "labels": ...}``), called under a fake
    mode (``torch.randint`` in it allocates nothing). ``input_placements`` fixes the
    placements of the model's inputs: one placement for all (``"S(0)R"``: the batch split
    on the first axis, labels alike), one entry per input, or a dict keyed like
    ``input_fn``'s (``None`` or a missing key leaves an input to the solver); ``output_placements`` fixes
    the placement of each output tensor (in the forward's pytree order; the loss's alone
    when ``loss_fn`` puts a loss inside the graph); by default a 0-dim output (a loss) is
    replicated and the others are the solver's choice. ``pins`` fixes the placement of
    parameters (by FQN) or graph nodes (by name), see :mod:`autoplan.constraints`.
    Placements are tuples of DTensor placements or short strings such as ``"S(0)R"``.
    """

    def here() -> Plan:
        cfg = config or PlanConfig()
        timings: dict[str, float] = {}
        done = _timed(timings, "trace", progress)
        traced = trace_joint(model, input_fn, loss_fn=loss_fn, param_dtype=cfg.param_torch_dtype)
        done()
        with _frozen_heap():
            return _plan_traced(
                traced, mesh, cfg, timings, input_placements, output_placements, pins, progress
            )

    return here() if broadcast_from is None else plan_on_one_rank(here, mesh, broadcast_from)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Leave the objects alive now out of the garbage collector's passes until the end.

    The traced graph, its fake tensors and torch's state outlive every later stage,
    yet each full collection walks them again: measured with ``gc.callbacks`` from the
    strategies stage to the ILP build, 2 full passes (0.55 s) on LLaMA3-8B 32 layers
    native and 3 (1.40 s) on 70B. ``gc.freeze`` moves them to the permanent
    generation (Python docs, ``gc.freeze``); ``gc.unfreeze`` hands them back.

    The stages also make millions of small objects (placement tuples, strategies,
    keys) that no cycle holds, and at the default first-generation threshold (700
    allocations) the collector ran 1 457 young, 132 middle and 10 full passes on 70B
    native after the trace: 1.26-1.33 s. With a threshold of 10 000 while planning,
    82, 7 and none: 0.27 s, the same peak RSS (1.33 against 1.34 GB).
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


# Allocations between young collections while planning (see _frozen_heap).
_YOUNG_THRESHOLD = 10_000


def _plan_traced(
    traced: TracedGraph,
    mesh: DeviceMesh,
    config: PlanConfig,
    timings: dict[str, float],
    input_placements: InputPlacements | None,
    output_placements: Sequence[PlacementSpec] | None,
    pins: Mapping[str, PinSpec] | None,
    progress: Progress | None,
) -> Plan:
    """The stages after the trace (see :func:`plan`)."""
    done = _timed(timings, "rewrite", progress)
    traced, _ = rewrite(traced, mm_mode=config.mm_mode)
    done()
    done = _timed(timings, "strategies", progress)
    table = enumerate_strategies(traced, mesh, mm_mode=config.mm_mode)
    done()
    specs = _inputs_by_key(input_placements, traced.input_keys)
    allowed = _constrain(table, traced.inputs, specs, "input_placements")
    if output_placements is None:
        output_placements = _scalars_replicated(traced, len(table.mesh_shape))
    allowed |= _constrain(table, traced.outputs, output_placements, "output_placements")
    pinned = resolve_pins(traced, table, pins)
    for node, mask in pinned.items():
        if node in allowed and not (allowed[node] & mask).any():
            raise ValueError(
                f"pins: node {node} is pinned to a placement its input or output "
                "placement constraint excludes; drop one of the two."
            )
        allowed[node] = allowed.get(node, mask) & mask
    done = _timed(timings, "cost", progress)
    costs = price(
        table,
        traced,
        config.topology,
        optimizer_states=config.optimizer_states,
        master_bytes=4 if config.param_dtype is not None else None,
        reduce_bytes=config.reduce_dtype_bytes,
        routes=config.routes,
    )
    recompute = recompute_set(traced, config.activation_checkpointing)
    costs = priced_recompute(costs, recompute)
    stepped = with_recompute(traced, recompute)  # the graph the applied module runs
    activations = activation_memory(stepped, table)
    capped = costs.memory | activations if config.activation_memory else costs.memory
    costs = replace(costs, memory=capped, activations=activations)
    done()
    base = _plan_fields(traced, table, config, timings) | {
        "recompute": list(recompute),
        "checkpointing": dict.fromkeys(layer_names(traced), config.activation_checkpointing),
    }
    budget = config.memory_budget_bytes
    if budget is not None:
        need = _min_memory(costs, allowed)
        if need > budget:
            return Plan(
                status="infeasible",
                objective_us=math.nan,
                compute_us=math.nan,
                comm_us=math.nan,
                message=(
                    f"infeasible: memory_budget_gib ({config.memory_budget_gib}) is below the "
                    f"smallest footprint any plan has on this mesh, {need / 2**30:.6g} GiB "
                    f"({need:.0f} bytes) of parameters + gradients + optimizer state"
                    f"{' + saved activations' if config.activation_memory else ''} per device; "
                    "raise the budget or use a larger mesh."
                ),
                **base,
            )
    done = _timed(timings, "ilp_build", progress)
    keep = set(allowed)
    reduction = collapse_followers(table, costs, keep=keep) if config.collapse_followers else None
    ilp_costs = reduction.costs if reduction is not None else costs
    clustering = cluster(ilp_costs) if config.cluster_layers else None
    tie = untie(clustering.rep, set(pinned)) if clustering is not None else None
    plain_vars, plain_cons = plain_size(costs, budget is not None)
    base["ilp_size"] = {
        "variables": 0,
        "constraints": 0,
        "plain_variables": plain_vars,
        "plain_constraints": plain_cons,
        "nodes": len(ilp_costs.compute),
        "merged": reduction.num_merged if reduction is not None else 0,
        "tied": sum(1 for v, r in (tie or {}).items() if v != r),
    }
    try:
        model_ilp = build_ilp(
            ilp_costs,
            allowed=allowed,
            memory_budget_bytes=budget,
            tie=tie,
            edge_keys=clustering.edge_keys if clustering is not None else None,
            prune=config.prune_dominated,
        )
    except InfeasibleError as err:
        done()
        return _infeasible(f"infeasible: {err}; relax the placement constraints.", base)
    done()
    base["ilp_size"] |= {
        "variables": model_ilp.num_variables,
        "constraints": model_ilp.num_constraints,
        "pruned": model_ilp.stats.get("pruned", 0),
    }
    done = _timed(timings, "solve", progress)
    solution, split = solve_untying(
        ilp_costs,
        model_ilp,
        solver=config.solver,
        time_limit_s=config.time_limit_s,
        mip_gap=config.mip_gap,
        fixing=config.reduced_cost_fixing,
        untie=config.untie_under_budget,
    )
    if split:
        base["ilp_size"]["untied"] = split
    done()
    if solution.status == "infeasible":
        return _infeasible(
            "infeasible: the solver found no plan meeting the placement constraints "
            "and memory_budget_gib together; relax one of them.",
            base,
        )
    if not solution.choice:
        raise ValueError(
            f"plan.time_limit_s ({config.time_limit_s} s): the solver stopped before it "
            "found any plan (no plan could be read off the bound, and the LP relaxation "
            "and the MIP ran out of time); raise plan.time_limit_s."
        )
    if solution.status == "time_limit" and solution.proof_budget_s is not None:
        base["message"] = (
            "time_limit: after the untie stage (layers under the memory budget), the MIP "
            f"over tied plans had {solution.proof_budget_s:.3g} s and stopped before proving "
            f"that none beats this plan; it is at most {solution.gap:.3%} above any tied "
            "plan. Set plan.untie_under_budget: false to solve the tied ILP alone, within "
            "plan.time_limit_s."
        )
    elif solution.status == "optimal" and split:
        base["message"] = (
            f"optimal among tied plans: {split} twin class{'es are' if split > 1 else ' is'} "
            "split under the memory budget (plan.untie_under_budget), and the MIP over tied "
            "plans proved that none beats this plan; other splits were searched, not proved. "
            "Set plan.untie_under_budget: false for the tied optimum alone."
        )
    elif solution.status == "time_limit":
        gap = solution.gap
        base["message"] = (
            f"time_limit: the solver stopped at time_limit_s ({config.time_limit_s} s) before "
            "proving this plan optimal"
            + (f"; it is at most {gap:.2%} above the optimum" if math.isfinite(gap) else "")
            + ". Raise plan.time_limit_s, or accept a gap with plan.mip_gap."
        )
    if math.isfinite(solution.bound_us):
        base["bound_us"] = float(solution.bound_us)
    choice = reduction.expand(solution.choice) if reduction is not None else solution.choice
    return read_solution(
        traced, table, costs, config, choice, solution.status, base, stepped=stepped
    )


def _infeasible(message: str, base: dict[str, Any]) -> Plan:
    return Plan(
        status="infeasible",
        objective_us=math.nan,
        compute_us=math.nan,
        comm_us=math.nan,
        message=message,
        **base,
    )


def _plan_fields(
    traced: TracedGraph, table: StrategyTable, config: PlanConfig, timings: dict[str, float]
) -> dict[str, Any]:
    shapes = {}
    for fqn, pname in zip(traced.param_fqns, traced.params, strict=True):
        info = table.nodes[pname].out_tensors[0]
        shapes[fqn] = info.shape if info else ()
    return {
        "param_placements": {},
        "node_placements": {},
        "timings": timings,
        "ilp_size": {"variables": 0, "constraints": 0},
        "mesh_shape": table.mesh_shape,
        "axis_names": table.axis_names,
        "config": config.to_dict(),
        "graph_nodes": traced.num_nodes,
        "solver": config.solver,
        "param_shapes": shapes,
        "input_shapes": tuple(tuple(traced.node(n).meta["val"].shape) for n in traced.inputs),
        "input_keys": traced.input_keys,
        "fallback_ops": table.fallback_ops,
        "loss_fn": traced.loss_name,
        "graph_fingerprint": fingerprint(traced.gm),
    }
