"""The pipeline in one call: trace -> rewrite -> strategies -> cost -> ILP -> Plan.

Input: an ``nn.Module`` (meta device is fine), a function returning global
example inputs, a ``DeviceMesh`` (``autoplan.fake_mesh`` for planning) and a
:class:`~autoplan.core.config.PlanConfig`. Output: a :class:`~autoplan.result.plan.Plan`.
The stages before the solver are :func:`autoplan.planner.front_end.front_end`'s, the solve
:mod:`autoplan.planner.solve_mode`'s; this module sequences them, times each phase and
tells a progress callback as each starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from autoplan.core.config import PlanConfig
from autoplan.core.graph import fingerprint
from autoplan.core.torch_adapter import DeviceMesh
from autoplan.ilp.backends import check_solver
from autoplan.planner.api_checks import check_plan_args
from autoplan.planner.bucket_search import search_buckets
from autoplan.planner.front_end import front_end
from autoplan.planner.job import plan_on_one_rank
from autoplan.planner.problem import PricedProblem
from autoplan.planner.solve_mode import planned_mode, solve_mode
from autoplan.planner.transient import reserve_transient
from autoplan.result.plan import Plan
from autoplan.strategies.constraints import InputPlacements, PinSpec, PlacementSpec
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import LossFn, TracedGraph

__all__ = ["InputPlacements", "PlacementSpec", "Progress", "plan"]

Progress = Callable[[str], None]


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
    plan (:mod:`autoplan.planner.job`); without, each process plans for itself (deterministic,
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
    parameters (by FQN) or graph nodes (by name), see :mod:`autoplan.strategies.constraints`.
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

        def timed(phase: str) -> Callable[[], None]:
            return _timed(timings, phase, progress)

        with front_end(
            model,
            input_fn,
            mesh,
            config=cfg,
            input_placements=input_placements,
            output_placements=output_placements,
            pins=pins,
            loss_fn=loss_fn,
            timed=timed,
        ) as problem:
            base = _plan_fields(problem.traced, problem.table, cfg, timings)
            mode = planned_mode(cfg)

            def solve(
                priced: PricedProblem, modes: str | Mapping[str, str] = mode, room: float = 0.0
            ) -> Plan:
                first = solve_mode(priced, modes, base, timed, reserve=room)
                return reserve_transient(priced, first, modes, base, timed, reserve=room)

            first = solve(problem)
            # the search keeps the layers' modes auto chose: it re-places, not re-checkpoints
            kept = first.checkpointing if mode == "auto" and first.checkpointing else mode
            return search_buckets(
                problem, first, lambda priced, room: solve(priced, kept, room), timed
            )

    return here() if broadcast_from is None else plan_on_one_rank(here, mesh, broadcast_from)


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
