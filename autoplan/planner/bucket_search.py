"""Stage 5 (solve), bucket search: plans priced with the launches their buckets share.

Input: the priced problem, the plan solved with one launch per move, and the solve to
run again (the mode's solve and the transient's re-solves, from a priced problem and the
bytes of the budget kept for the transient to a plan; with ``auto`` checkpointing it
keeps the layers' modes of the first plan, as a re-solve choosing them again took 5-40x
the first solve's time). Output: the plan with the lowest estimate with its buckets
(:attr:`~autoplan.result.plan.Plan.estimated_step_us`) among that plan and the plans
solved with the kinds it merges opened (:mod:`autoplan.cost.shared_launch`).

Why: the ILP prices each move with a launch of its own, an upper bound on a step that
merges them, so a layout whose moves merge well (data parallelism's many gradient
reductions) is priced as if each launched alone. Opening every kind at once would
undercharge a kind with a single member (it pays its whole launch when run) and makes
the MIP far harder; opening only the kinds a solved plan already merges, and keeping
the plan estimated cheapest, costs a solve or two and never returns a plan estimated
dearer than the first. Skipped when merging saves little of the first plan's step (a
large model's launches are a small part of it), so most plans are solved once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.compute import ComputeModel
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.shared_launch import BucketKind, SharedLaunch, open_costs
from autoplan.planner.problem import PricedProblem, Timer
from autoplan.planner.transient import peak_fits
from autoplan.result.plan import Plan

__all__ = ["ROUNDS", "WORTH", "search_buckets", "with_shared_launches"]

ROUNDS = 2  # solves with kinds opened, at most
# the share of its estimated step the first plan's buckets must save for a search
WORTH = 0.02
# a plan replaces the best so far only when estimated cheaper by more than rounding
_BETTER = 1e-9


def search_buckets(
    problem: PricedProblem,
    first: Plan,
    solve: Callable[[PricedProblem, float], Plan],
    timed: Timer,
) -> Plan:
    """``first``, or a plan solved with the bucket kinds it merges (and then those the
    new plan merges) charged their shares, when that plan's bucketed estimate is lower
    and its peak fits a budget that counts activations as ``first``'s does."""
    cap = problem.config.bucket_mib * 2**20
    if cap <= 0 or first.status == "infeasible" or not _worth(first):
        return first
    room = _room(first, problem)
    best, plan, opened = first, first, frozenset[BucketKind]()
    best_opened = opened
    for _ in range(ROUNDS):
        left = problem.clock.left(problem.config.time_limit_s)
        wider = opened | _merged_kinds(plan)
        if (left is not None and left <= 0) or wider == opened:
            break
        opened = wider
        done = timed("buckets")
        priced = with_shared_launches(problem, opened)
        done()
        plan = solve(priced, room)
        if plan.status == "infeasible":
            break
        cheaper = plan.estimated_step_us < best.estimated_step_us * (1.0 - _BETTER)
        if cheaper and (peak_fits(plan, problem.config) or not peak_fits(first, problem.config)):
            best, best_opened = plan, opened
    if best is first:
        return first
    kinds = ", ".join(_describe(k, best.axis_names) for k in sorted(best_opened))
    auto = problem.config.activation_checkpointing == "auto"
    kept = " and the layers' checkpointing modes kept" if auto else ""
    note = (
        f"Solved again with the moves of each merged kind ({kinds}) charged a share of "
        f"their bucket's launch{kept}: estimated {best.estimated_step_us / 1e3:.4g} ms with its "
        f"buckets, against {first.estimated_step_us / 1e3:.4g} ms for the plan priced one "
        "launch per move."
    )
    message = " ".join(filter(None, (best.message, note)))
    return replace(best, message=message, shared_launches=tuple(sorted(best_opened)))


def with_shared_launches(problem: PricedProblem, kinds: Iterable[BucketKind]) -> PricedProblem:
    """``problem`` with the moves of ``kinds`` charged a share of their bucket's launch
    (:func:`~autoplan.cost.shared_launch.open_costs`), its solves not yet built."""
    cap = problem.config.bucket_mib * 2**20
    compute = ComputeModel.of(problem.config.topology, problem.table.mesh_shape)
    launch = SharedLaunch.of(problem.traced, problem.costs, kinds, cap, compute)
    redist = RedistributeModel(problem.table.mesh_shape, CollectiveModel(problem.config.topology))
    return replace(
        problem,
        costs=open_costs(problem.costs, launch, redist),
        launch=launch,
        built={},
        reductions={},
        memory_price=_memory_price(problem),
    )


def _memory_price(problem: PricedProblem) -> float | None:
    """Where the memory multiplier of ``problem``'s latest solve ended (its built ILP's
    warm state; None before any solve): re-priced by shared launches, the problem keeps
    its budget and most prices, so the multiplier barely moves."""
    warm = [model.warm for model, _ in problem.built.values() if model.warm is not None]
    return warm[-1].lam if warm else None


def _room(first: Plan, problem: PricedProblem) -> float:
    """The bytes of the budget the searched solves keep for the backward's transient from
    the start: the first plan's transient, when the budget counts it and the first plan
    fits. Their plans keep the first's checkpointing modes and differ in placements, so
    their transients are near its own; solved with no room they fill the budget, go over
    it by their transient and are solved again (:mod:`autoplan.planner.transient`). A plan
    whose transient is larger is solved again as before; the first plan's own layout fits
    the room kept."""
    if problem.config.memory_budget_bytes is None or not problem.config.counts_activations:
        return 0.0
    if not peak_fits(first, problem.config):
        return 0.0
    return first.memory_breakdown.get("transient", 0.0)


def _worth(plan: Plan) -> bool:
    """Whether ``plan``'s buckets save at least :data:`WORTH` of its estimated step."""
    saved = plan.objective_us - plan.estimated_step_us
    return saved >= WORTH * plan.estimated_step_us


def _merged_kinds(plan: Plan) -> frozenset[BucketKind]:
    return frozenset((b.where, b.kind, tuple(b.axes)) for b in plan.buckets if b.members > 1)


def _describe(kind: BucketKind, names: tuple[str, ...]) -> str:
    where, collective, axes = kind
    return f"{where} {collective} over {','.join(names[a] for a in axes)}"
