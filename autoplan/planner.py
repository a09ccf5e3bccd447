"""The pipeline in one call: trace -> rewrite -> strategies -> cost -> ILP -> Plan.

Input: an ``nn.Module`` (meta device is fine), a function returning global
example inputs, a ``DeviceMesh`` (``autoplan.fake_mesh`` for planning) and a
:class:`~autoplan.config.PlanConfig`. Output: a :class:`~autoplan.plan.Plan`.
Each stage is timed; a progress callback hears the start of each phase.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch import nn
from torch.distributed.tensor import Placement

from autoplan.api_checks import check_plan_args
from autoplan.config import PlanConfig
from autoplan.constraints import PinSpec, resolve_pins
from autoplan.cost.price import price
from autoplan.errors import PlanError
from autoplan.graph import fingerprint
from autoplan.ilp.solver.backends import check_solver
from autoplan.job import plan_on_one_rank
from autoplan.placements import Placements, fmt, parse
from autoplan.plan import Plan
from autoplan.rewrite import rewrite
from autoplan.solve_stage import Problem, planned_mode, solve_mode
from autoplan.strategies.dtensor import DeviceMesh
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.strategies.table import StrategyTable
from autoplan.trace import LossFn, TracedGraph, trace_joint
from autoplan.transient import reserve_transient

Progress = Callable[[str], None]
PlacementSpec = Sequence[Any] | str
# one placement for every input, one per input, or one per keyword of input_fn's dict
InputPlacements = PlacementSpec | Sequence[PlacementSpec] | Mapping[str, PlacementSpec]


def _as_placements(spec: PlacementSpec, num_axes: int, what: str) -> Placements:
    if isinstance(spec, str):
        try:
            return parse(spec, num_axes)
        except PlanError as exc:
            raise PlanError(f"{what}: {exc}") from exc
    if not isinstance(spec, Sequence):
        raise PlanError(
            f"{what} is {spec!r}: a placement is a string such as 'S(0)R' or a tuple of "
            "DTensor placements, one per mesh axis."
        )
    placements = tuple(spec)
    if len(placements) != num_axes:
        raise PlanError(
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
        noun = "input" if what == "input_placements" else "output tensor"
        raise PlanError(
            f"{what} lists {len(specs)} placements for the model's {len(names)} "
            f"{noun}{'s' if len(names) != 1 else ''}; give one per {noun} (None leaves one to "
            "the solver), or one placement such as 'S(0)R' for all."
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
            raise PlanError(
                f"{what}[{i}] = {fmt(want)} is not possible for a tensor of shape {shape} on mesh "
                f"{table.mesh_shape}: a sharded dim must divide evenly by the mesh axes sharding it."
            )
        allowed[name] = mask
    return allowed


def _one_for_all(specs: Any, count: int) -> Any:
    """``specs`` repeated ``count`` times when it is one placement (``"S(0)R"`` or a tuple
    of DTensor placements), else as given."""
    if isinstance(specs, str) or (
        isinstance(specs, Sequence) and specs and all(isinstance(p, Placement) for p in specs)
    ):
        return [specs] * count
    return specs


def _inputs_by_key(
    specs: InputPlacements | None,
    keys: Sequence[int | str],
) -> Sequence[PlacementSpec] | None:
    """``input_placements`` as one entry per input in the graph's order (``None``: left to
    the solver). One placement (``"S(0)R"``) places every input alike, the batch split the
    same way for the token ids and their labels; a dict is keyed like ``input_fn``'s."""
    specs = _one_for_all(specs, len(keys))
    if not isinstance(specs, Mapping):
        return specs
    unknown = [k for k in specs if k not in keys]
    if unknown:
        known = ", ".join(repr(k) for k in keys if isinstance(k, str)) or "none (positional)"
        raise PlanError(
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


def _timed(timings: dict[str, float], phase: str, progress: Progress | None) -> Callable[[], None]:
    if progress is not None:
        progress(phase)
    start = time.perf_counter()

    def done() -> None:  # a phase run once per checkpointing mode adds up
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start

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
    ``input_fn``'s (``None`` or a missing key leaves an input to the solver);
    ``output_placements`` fixes the placement of each output tensor (one for all, or one
    per output in the forward's pytree order; the loss's alone when ``loss_fn`` puts a
    loss inside the graph); by default a 0-dim output (a loss) is replicated and the
    others are the solver's choice. ``pins`` fixes the placement of
    parameters (by FQN) or graph nodes (by name), see :mod:`autoplan.constraints`.
    Placements are tuples of DTensor placements or short strings such as ``"S(0)R"``.
    """
    check_plan_args(
        model=model,
        input_fn=input_fn,
        mesh=mesh,
        config=config,
        input_placements=input_placements,
        output_placements=output_placements,
        pins=pins,
        loss_fn=loss_fn,
        progress=progress,
    )
    check_solver((config or PlanConfig()).solver)  # a missing solver fails before the trace

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


def constraints(
    traced: TracedGraph,
    table: StrategyTable,
    input_placements: InputPlacements | None,
    output_placements: Sequence[PlacementSpec] | None,
    pins: Mapping[str, PinSpec] | None,
) -> tuple[dict[str, np.ndarray], set[str]]:
    """Each constrained node's mask of allowed strategies (inputs, outputs, pins; a 0-dim
    output replicated unless ``output_placements`` says otherwise) and the pinned nodes:
    what the solver keeps out of merging and tying, so :mod:`autoplan.rebuild` asks here
    too."""
    specs = _inputs_by_key(input_placements, traced.input_keys)
    allowed = _constrain(table, traced.inputs, specs, "input_placements")
    if output_placements is None:
        output_placements = _scalars_replicated(traced, len(table.mesh_shape))
    output_placements = _one_for_all(output_placements, len(traced.outputs))
    allowed |= _constrain(table, traced.outputs, output_placements, "output_placements")
    pinned = resolve_pins(traced, table, pins)
    for node, mask in pinned.items():
        if node in allowed and not (allowed[node] & mask).any():
            raise PlanError(
                f"pins: node {node} is pinned to a placement its input or output "
                "placement constraint excludes; drop one of the two."
            )
        allowed[node] = allowed.get(node, mask) & mask
    return allowed, set(pinned)


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
    allowed, pinned = constraints(traced, table, input_placements, output_placements, pins)
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
    done()
    base = _plan_fields(traced, table, config, timings)
    mode = planned_mode(config)
    problem = Problem(traced, table, costs, config, allowed, pinned)

    def timed(phase: str) -> Callable[[], None]:
        return _timed(timings, phase, progress)

    return reserve_transient(problem, solve_mode(problem, mode, base, timed), mode, base, timed)


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
