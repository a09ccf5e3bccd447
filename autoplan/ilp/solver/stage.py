"""Stage 5c to 5e, the ILP stage's entry point: bound, untie, solve, in that order.

Input: the cost table the tied ILP was built from and the tied
:class:`~autoplan.ilp.formulation.build.IlpModel`, with the solver's options. Output:
a :class:`~autoplan.ilp.solver.solve.Solution` and the number of tied classes whose
copies the plan splits (:func:`solve_ilp`).

Order: the tied relaxation (:func:`~autoplan.ilp.bound.relax.relax`), then, under a
binding memory budget, the untie step (:mod:`autoplan.ilp.untying.untie`), then the
tied MIP (:func:`~autoplan.ilp.solver.solve.solve`) with the untied plan's cost as its
cutoff. Why this order: the MIP then only proves that no tied plan is cheaper than
the plan returned, and with a cutoff that close to the LP bound the fixing drops most
columns. With untying off, or no budget that binds, it is the relaxation and the
tied MIP alone.
"""

from __future__ import annotations

import math
from dataclasses import replace

from autoplan.cost.price import CostTable
from autoplan.ilp.bound.relax import relax
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.solver.solve import Solution, solve
from autoplan.ilp.untying.untie import untie_under_budget, worth_untying

# The tied MIP that checks no tied plan beats the untied one stops after this many
# branch-and-bound nodes (per MIP, under the branching on modes), and a large one after
# PROOF_WORK column-nodes (solve.node_limit): limits of work that give the same plan on
# any machine; cut there, the plan is returned with status node_limit and its gap to
# the tied bound. It gets a limit of its own, not the user's whole time: it can only
# find a tied plan cheaper by at most that gap.
PROOF_NODES = 2000
PROOF_WORK = 1_500_000


def solve_ilp(
    costs: CostTable,
    model: IlpModel,
    *,
    solver: str = "cbc",
    time_limit_s: float | None = None,
    mip_gap: float = 0.0,
    fixing: bool = True,
    untie: bool = True,
    lam: float | None = None,
) -> tuple[Solution, int]:
    """Solve the tied ``model``, untying first when
    :func:`~autoplan.ilp.untying.untie.worth_untying` (and ``untie``):
    the plan and the number of tied classes whose copies ended up on different strategies.

    The untied plan's cost is the tied MIP's cutoff, so the MIP only proves that no tied
    plan is cheaper, and with a cutoff that close to the LP bound most columns go. Its
    status and bound are the tied MIP's: ``optimal`` says no tied plan beats the plan
    returned (:mod:`autoplan.ilp.untying.untie` says what is known about untied ones).
    That MIP stops at :data:`PROOF_NODES` nodes, fewer on a large MIP (:data:`PROOF_WORK`);
    cut there, the untied plan comes back with status ``node_limit`` and its
    ``proof_nodes`` set to the limit it had. Without ``fixing``, the MIP
    runs alone on the whole model. No step reads the clock but to keep ``time_limit_s``.
    ``lam``: a memory multiplier a solve of a nearly equal problem ended at, for the
    relaxation's ascent (:func:`~autoplan.ilp.bound.relax.relax`).
    """
    if not fixing:
        return solve(
            model, solver=solver, time_limit_s=time_limit_s, mip_gap=mip_gap, fixing=False
        ), 0
    relaxed = relax(model, solver=solver, time_limit_s=time_limit_s, lam=lam)
    untied = None
    left = time_limit_s
    if untie and worth_untying(model, relaxed):
        untied = untie_under_budget(
            costs, model, relaxed, solver=solver, time_limit_s=time_limit_s, mip_gap=mip_gap
        )
        if left is not None:
            left = max(1.0, left - untied.seconds)
    tied = solve(
        model,
        solver=solver,
        time_limit_s=left,
        mip_gap=mip_gap,
        relaxed=relaxed,
        cutoff=untied.objective_us if untied is not None else math.inf,
        max_nodes=PROOF_NODES if untied is not None else None,
        node_work=PROOF_WORK,
    )
    tied = replace(tied, warm=relaxed.warm)  # every plan returned below is made from it
    if untied is None:
        return tied, 0
    seconds = tied.solve_seconds + untied.seconds
    status = "time_limit" if untied.out_of_time else tied.status
    cut = None
    if status == "node_limit":
        cut = int((tied.stats or {}).get("node_limit", PROOF_NODES))
    if not tied.choice or untied.objective_us >= tied.objective_us:
        return replace(tied, status=status, solve_seconds=seconds, proof_nodes=cut), 0
    rep = model.reduced.rep
    split = {rep[v] for v, i in untied.choice.items() if i != untied.choice[rep[v]]}
    # The tied bound is no bound on the untied optimum: it is capped at the plan.
    merged = replace(
        tied,
        status=status,
        objective_us=untied.objective_us,
        choice=untied.choice,
        solve_seconds=seconds,
        bound_us=min(tied.bound_us, untied.objective_us),  # nan stays nan
        proof_nodes=cut,
    )
    return merged, len(split)
