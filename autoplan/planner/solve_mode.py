"""Stages 4b-6 for one activation-checkpointing mode: the priced graph -> a Plan.

Input: a :class:`~autoplan.planner.problem.PricedProblem` (the traced graph, its strategy table and cost table, the
config and the placement constraints) and a checkpointing mode. Output: a
:class:`~autoplan.result.plan.Plan`: the mode's recomputation priced
(:mod:`autoplan.memory.recompute`), or with ``"auto"`` each layer's mode in the ILP
(:mod:`autoplan.memory.layer_modes`), its kept activations counted, the graph reductions, the
ILP, its solve and the read-out; or an infeasible plan saying which lever would help.

Why its own stage: a budget counting activations may need the plan solved again with
room kept for the backward's transient (:mod:`autoplan.planner.transient`), on the one trace,
strategy table and price table; the planner only sequences the stages.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError
from autoplan.cost.price import CostTable
from autoplan.ilp.formulation.build import IlpModel, build_ilp
from autoplan.ilp.formulation.problem import InfeasibleError, plain_size
from autoplan.ilp.reductions.followers import Reduction, collapse_followers
from autoplan.ilp.reductions.tying import ROUNDS, Clustering, cluster
from autoplan.ilp.solver.stage import solve_ilp
from autoplan.memory.recompute import checkpointed, layer_names, recompute_set
from autoplan.planner.problem import PricedProblem, Timer
from autoplan.planner.readout import read_solution
from autoplan.planner.solve_messages import infeasible, min_memory, status_message, too_small
from autoplan.result.plan import Plan
from autoplan.strategies.constraints import untie
from autoplan.trace.capture import TracedGraph

__all__ = ["planned_mode", "solve_mode", "structure"]


def solve_mode(
    problem: PricedProblem,
    mode: str | Mapping[str, str],
    base: dict[str, Any],
    timed: Timer,
    *,
    reserve: float = 0.0,
) -> Plan:
    """The plan of ``problem`` with activation checkpointing ``mode`` in every layer, a
    mode per layer name, or ``"auto"`` (the ILP chooses each layer's,
    :mod:`autoplan.memory.layer_modes`); ``reserve`` bytes of the budget are kept for the
    backward's transient peak."""
    if mode == "auto":
        return _solve_auto(problem, base, timed, reserve=reserve)
    traced, table, config = problem.traced, problem.table, problem.config
    key = _key(mode)
    kept = problem.reductions.get(key)
    if kept is None:  # a re-solve under a smaller budget reduces the same table
        done = timed("recompute")
        recompute = recompute_set(traced, mode)
        costs, stepped = checkpointed(
            traced, table, problem.costs, recompute, counted=config.counts_activations
        )
        done()
        done = timed("ilp_build")
        reduced = _uniform(problem, mode, costs)
        done()
        kept = problem.reductions[key] = (recompute, stepped, reduced)
    recompute, stepped, reduced = kept
    costs = reduced.plain
    base = _with_modes(base, traced, recompute, mode)
    found = _solve_reduced(problem, reduced, base, timed, reserve)
    if not isinstance(found, tuple):
        return found
    choice, status, base = found
    return read_solution(
        traced,
        table,
        costs,
        config,
        reduced.reduction.expand(choice),
        status,
        base,
        stepped=stepped,
        launch=problem.launch,
    )


def planned_mode(config: PlanConfig) -> str:
    """The mode a config plans with: ``auto`` without a budget is ``none`` (recomputing
    only adds time)."""
    mode = config.activation_checkpointing
    return "none" if mode == "auto" and config.memory_budget_gib is None else mode


def structure(problem: PricedProblem, mode: str) -> tuple[Reduction, dict[str, str]]:
    """What :func:`solve_mode` gives the solver for ``mode`` (a config's mode): the
    follower reduction and each node's twin (itself when untied), for ``explain`` to
    reason about the same groups."""
    if mode == "auto":
        reduced = _auto(problem)
    else:
        recompute = recompute_set(problem.traced, mode)
        costs, _ = checkpointed(
            problem.traced,
            problem.table,
            problem.costs,
            recompute,
            counted=problem.config.counts_activations,
        )
        reduced = _uniform(problem, mode, costs)
    _, tie = _tying(problem, reduced)
    return reduced.reduction, {v: v for v in problem.table.nodes} | (tie or {})


def _tying(
    problem: PricedProblem, reduced: _Reduced
) -> tuple[Clustering | None, dict[str, str] | None]:
    """The twin classes of ``reduced`` and each node's representative, pinned nodes on
    their own (none when ``cluster_layers`` is off)."""
    if not problem.config.cluster_layers:
        return None, None
    clustering = cluster(reduced.reduction.costs, rounds=reduced.tie_rounds)
    return clustering, untie(clustering.rep, problem.pinned)


def _uniform(problem: PricedProblem, mode: str | Mapping[str, str], costs: CostTable) -> _Reduced:
    """One mode's reduced table: the follower reduction of its priced recomputation."""
    reduction = (
        collapse_followers(problem.table, costs, keep=set(problem.allowed))
        if problem.config.collapse_followers
        else Reduction.unreduced(costs)
    )
    return _Reduced(reduction, problem.allowed, costs, _label(mode), key=_key(mode))


def _key(mode: str | Mapping[str, str]) -> Hashable:
    """Where a mode's reduction and built ILP are kept: a mode per layer (the bucket
    search keeps auto's) by its sorted pairs."""
    return mode if isinstance(mode, str) else ("layers", *sorted(mode.items()))


def _auto(problem: PricedProblem) -> _Reduced:
    """``auto``'s reduced table: the layers' modes in the roots' strategies."""
    reduction, space = problem.mode_space
    return _Reduced(
        replace(reduction, costs=space.costs),
        space.allowed(problem.allowed),
        problem.costs,  # the plain ILP's size is counted without the modes
        "auto",
        # a root per layer boundary chains the layers: each tying round reaches a layer
        # further from the ends, and one keeps the end layers apart as three do on the
        # reduction without modes
        tie_rounds=1,
        key="auto",
    )


def _solve_auto(
    problem: PricedProblem, base: dict[str, Any], timed: Timer, *, reserve: float
) -> Plan:
    """:func:`solve_mode` with the mode of each layer in the ILP, the plan read out of its
    exact recomputation."""
    traced, table, config = problem.traced, problem.table, problem.config
    done = timed("recompute")
    reduction, space = problem.mode_space
    reduced = _auto(problem)
    done()
    found = _solve_reduced(problem, reduced, _with_modes(base, traced, (), "auto"), timed, reserve)
    if not isinstance(found, tuple):
        return found
    choice, status, base = found
    own, modes = space.split(choice)
    done = timed("recompute")
    recompute = recompute_set(traced, modes)
    costs, stepped = checkpointed(traced, table, problem.costs, recompute, counted=True)
    done()
    base = _with_modes(base, traced, recompute, modes)
    plan = read_solution(
        traced,
        table,
        costs,
        config,
        reduction.expand(own),
        status,
        base,
        stepped=stepped,
        launch=problem.launch,
    )
    budget = config.memory_budget_bytes
    if budget is not None and plan.memory_bytes > budget - reserve:
        # the memory row counts no less than the exact kept bytes, so this is a defect
        raise AssertionError(
            f"auto plan keeps {plan.memory_bytes:.0f} bytes, over its row's {budget - reserve:.0f}"
        )
    return plan


def _with_modes(
    base: dict[str, Any],
    traced: TracedGraph,
    recompute: Sequence[str],
    mode: str | Mapping[str, str],
) -> dict[str, Any]:
    """``base`` with the recomputed nodes and each layer's mode."""
    return base | {
        "recompute": list(recompute),
        "checkpointing": {
            layer: mode.get(layer, "none") if isinstance(mode, Mapping) else mode
            for layer in layer_names(traced)
        },
        "ilp_size": dict(base["ilp_size"]),
    }


@dataclass(frozen=True)
class _Reduced:
    """One solve's reduced table (``reduction.costs``) and what differs between modes:
    the strategy masks over it, the unreduced table the plain ILP's size is counted on,
    the mode's name for messages, the rounds of layer tying
    (:func:`~autoplan.ilp.reductions.tying.cluster`) and the key its built ILP is kept under."""

    reduction: Reduction
    allowed: dict[str, np.ndarray]
    plain: CostTable
    label: str
    tie_rounds: int = ROUNDS
    key: Hashable | None = None  # where PricedProblem.built keeps its ILP (None: not kept)


def _solve_reduced(
    problem: PricedProblem, reduced: _Reduced, base: dict[str, Any], timed: Timer, reserve: float
) -> tuple[dict[str, int], str, dict[str, Any]] | Plan:
    """Tie, build and solve the ILP of ``reduced``: its choice per reduced node, the
    status and ``base`` with the ILP's sizes and message; or an infeasible plan."""
    config = problem.config
    budget = config.memory_budget_bytes
    reduction, allowed, label = reduced.reduction, reduced.allowed, reduced.label
    ilp_costs = reduction.costs
    if budget is not None:
        budget -= reserve
        need = min_memory(ilp_costs, allowed)
        if need > budget:
            return infeasible(
                too_small(
                    config, problem.traced.params, problem.allowed, label, ilp_costs, need, reserve
                ),
                base,
            )
    done = timed("ilp_build")
    plain_vars, plain_cons = plain_size(reduced.plain, budget is not None)
    base["ilp_size"] = {
        "variables": 0,
        "constraints": 0,
        "plain_variables": plain_vars,
        "plain_constraints": plain_cons,
        "nodes": len(ilp_costs.compute),
        "merged": reduction.num_merged,
    }
    try:
        model_ilp, tied = _built(problem, reduced, budget)
    except InfeasibleError as err:
        done()
        return infeasible(f"infeasible: {err}; relax the placement constraints.", base)
    done()
    base["ilp_size"]["tied"] = tied
    base["ilp_size"] |= {
        "variables": model_ilp.num_variables,
        "constraints": model_ilp.num_constraints,
        "pruned": model_ilp.stats.get("pruned", 0),
    }
    done = timed("solve")
    left = problem.clock.left(config.time_limit_s)
    solution, split = solve_ilp(
        ilp_costs,
        model_ilp,
        solver=config.solver,
        time_limit_s=None if left is None else max(1.0, left),
        mip_gap=config.mip_gap,
        fixing=config.reduced_cost_fixing,
        untie=config.untie_under_budget,
        lam=problem.memory_price,
    )
    done()
    if reduced.key is not None:
        problem.built[reduced.key] = (replace(model_ilp, warm=solution.warm), tied)
    if split:
        base["ilp_size"]["untied"] = split
    if solution.status == "infeasible":
        return infeasible(
            "infeasible: the solver found no plan meeting the placement constraints "
            "and memory_budget_gib together; relax one of them.",
            base,
        )
    if not solution.choice:
        raise PlanError(
            f"plan.time_limit_s ({config.time_limit_s} s): the solver stopped before it "
            "found any plan (no plan could be read off the bound, and the LP relaxation "
            "and the MIP ran out of time); raise plan.time_limit_s."
        )
    base["message"] = status_message(solution, split, config)
    if math.isfinite(solution.bound_us):
        base["bound_us"] = float(solution.bound_us)
    return solution.choice, solution.status, base


def _built(problem: PricedProblem, reduced: _Reduced, budget: float | None) -> tuple[IlpModel, int]:
    """The ILP of ``reduced`` under ``budget`` and how many nodes it ties to a twin: the
    one built before for the same key with its memory row moved
    (:meth:`~autoplan.ilp.formulation.build.IlpModel.with_budget`) when it can be, else built."""
    kept = problem.built.get(reduced.key) if reduced.key is not None else None
    if kept is not None and budget is not None:
        moved = kept[0].with_budget(budget)
        if moved is not None:
            return moved, kept[1]
    config, ilp_costs = problem.config, reduced.reduction.costs
    clustering, tie = _tying(problem, reduced)
    model_ilp = build_ilp(
        ilp_costs,
        allowed=reduced.allowed,
        memory_budget_bytes=budget,
        tie=tie,
        edge_keys=clustering.edge_keys if clustering is not None else None,
        prune=config.prune_dominated,
    )
    return model_ilp, sum(1 for v, r in (tie or {}).items() if v != r)


def _label(mode: str | Mapping[str, str]) -> str:
    """A mode, or a per-layer one by the modes it mixes."""
    if isinstance(mode, Mapping):
        return "+".join(sorted(set(mode.values())))
    return mode
