r"""Stage 5b (formulation), build: the integer program whose optimum is the plan.

Input: a :class:`~autoplan.cost.price.CostTable` (plus which strategies each
node may keep, the tie map of repeated layers and a memory budget). Output:
an :class:`IlpModel` holding the problem as solver-ready arrays
(:mod:`autoplan.ilp.formulation.matrix`) and the columns the solution is read from.
Why: this is the one place that runs the formulation's steps in order, and its
docstring is the ILP's math, naming where each constraint group is written.

The math (microseconds of estimated step time)::

    variables   s[r,i] ∈ {0,1}       class r runs strategy i          (matrix.emit)
                e[uv,g,h] ∈ [0,1]    edge uv moves group g -> group h  (matrix.emit)

    one strategy per class    Σ_i s[r,i] = 1                                 (matrix.emit)
    edge linearization        Σ_h e[uv,g,h] = Σ_{i: grp(u,i)=g} s[u,i]       (matrix.emit)
                              Σ_g e[uv,g,h] = Σ_{j: grp(v,j)=h} s[v,j]
    memory per device         Σ_r Σ_i M[r,i] · s[r,i] ≤ budget               (matrix._memory_row)

    a route-priced edge uv (cost.routes) is a flow instead of e[uv,·,·]:
                f[uv,a] ∈ [0,1]      flow on move a = (x -> y) of uv's network, price w_a
                Σ_{a out of q} f - Σ_{a into q} f = Σ_{i: state(u,i)=q} s[u,i]
                                                  - Σ_{j: state(v,j)=q} s[v,j]   per state q
                and Σ_a w_a · f[uv,a] replaces Σ_gh R[uv,g,h] · e[uv,g,h]   (matrix._flow_rows)

    minimize   Σ_r Σ_i L[r,i] · s[r,i]  +  Σ_uv Σ_gh R[uv,g,h] · e[uv,g,h]

A class r is a node, or the nodes of repeated layers tied to one
representative (:mod:`autoplan.ilp.reductions.tying`); L sums its members' compute,
R is a tied edge's price times the number of edges it stands for.
Groups g, h are *distinct price rows and columns* of the edge, not
strategies: R depends only on the placement pair, so the linearization of
s[u,i]·s[v,j] is exact over groups and much smaller. With s integral, the two
sums fix the group indicators to 0/1 and force e to their product, so e may
be continuous. An infinite price (a move DTensor cannot make) has no
variable. One column sum per edge is implied by the others and left out.
Gradient edges (slot -1) tie a parameter's gradient to the parameter's
placement: the price of that move is the gradient reduction.

Flows: when R is a cheapest-route price (the distance between two states
of a network of direct moves), one unit of flow from u's state to v's
costs exactly R with s integral, and its LP relaxation is the same
transport problem as the pairwise one over the same distances, so the
bound is unchanged; the network has far fewer moves than placement pairs.

Before the arrays are laid out, :mod:`autoplan.ilp.formulation.problem` folds edges that
do not couple two choices into L and :mod:`autoplan.ilp.formulation.prune` removes
dominated strategies; both keep the optimum. A class left with one strategy
has no variable: its cost is a constant and its edges' rows take it on the
right-hand side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.formulation.matrix import MEMORY_UNIT, Emitted, emit
from autoplan.ilp.formulation.problem import Problem, build_problem, share_equal_prices, simplify
from autoplan.ilp.formulation.prune import prune_dominated


@dataclass(frozen=True)
class Warm:
    """Where a dual ascent on a model ended (:mod:`autoplan.ilp.bound.dual` makes and reads
    it; opaque here). Any messages bound every budget of the same problem, so an ascent
    under another budget starts from them: the model carries it to :meth:`IlpModel.with_budget`.
    ``lam`` is the memory multiplier it ended at (microseconds per MiB of the memory row)."""

    snapshot: tuple
    lam: float = 0.0


@dataclass
class IlpModel:
    """A built ILP and the handles to read a solution from.

    ``emitted`` holds the solver arrays and the column of every class strategy
    and edge move; ``reduced`` is the numpy problem they were laid out from;
    ``allowed[v]`` marks node v's strategies still allowed after the
    reductions; ``stats`` counts what the reductions removed.
    """

    emitted: Emitted
    reduced: Problem
    allowed: dict[str, np.ndarray]
    stats: dict[str, int] = field(default_factory=dict)
    warm: Warm | None = None  # where an ascent on this ILP ended (relax starts there)

    @property
    def num_variables(self) -> int:
        return self.emitted.matrix.num_cols

    @property
    def num_constraints(self) -> int:
        return self.emitted.matrix.num_rows

    @property
    def infeasible(self) -> str:
        return self.emitted.infeasible

    def with_budget(self, budget: float) -> IlpModel | None:
        """This ILP under a smaller memory budget, when only its memory row's bound moves:
        the row caps the same columns less by the difference, and what the reductions
        removed does not depend on the budget's value (pruning compares memory whenever a
        budget is set). None when the row is absent (every plan fit) or can no longer
        hold: build again, for the row or the message. ``warm`` comes along: any
        messages bound every budget."""
        m, p = self.emitted.matrix, self.reduced
        rows = np.flatnonzero(np.isneginf(m.row_lower))  # the one row with no lower bound
        if p.budget is None or budget > p.budget or len(rows) != 1:
            return None
        upper = m.row_upper.copy()
        upper[rows[0]] -= (p.budget - budget) / MEMORY_UNIT
        if upper[rows[0]] < 0:
            return None
        matrix = replace(m, row_upper=upper)
        return replace(
            self,
            emitted=replace(self.emitted, matrix=matrix),
            reduced=replace(p, budget=budget),
        )


# Pruning rounds build_ilp runs: later rounds remove few strategies (those dominated once
# their neighbours lost some) and the solve is no faster for them.
_PRUNE_ROUNDS = 1


def build_ilp(
    costs: CostTable,
    *,
    allowed: Mapping[str, np.ndarray] | None = None,
    memory_budget_bytes: float | None = None,
    tie: Mapping[str, str] | None = None,
    edge_keys: Mapping[int, str] | None = None,
    prune: bool = True,
) -> IlpModel:
    """Build the ILP of the module docstring for ``costs``.

    ``allowed[v]`` masks node v's strategies (user placement constraints);
    missing nodes allow all. ``tie[v] = r`` makes v use r's variables (see
    :mod:`autoplan.ilp.reductions.tying`): tied nodes must have the same strategy list.
    ``edge_keys`` are the clustering's edge price keys, so they are hashed once.
    ``prune`` removes dominated strategies first (:mod:`autoplan.ilp.formulation.prune`).
    Raises :class:`~autoplan.ilp.formulation.problem.InfeasibleError` (a ValueError) naming
    the node or edge when the constraints alone leave no plan.
    """
    p = build_problem(
        costs,
        allowed=allowed,
        tie=tie,
        edge_keys=edge_keys,
        memory_budget_bytes=memory_budget_bytes,
    )
    simplify(p)
    before = p.num_allowed()
    pruned = prune_dominated(p, max_rounds=_PRUNE_ROUNDS) if prune else 0
    share_equal_prices(p)
    stats = {
        "classes": len(p.linear),
        "strategies": before,
        "pruned": pruned,
        "edges": len(p.edges),
    }
    return IlpModel(
        emit(p),
        p,
        {v: np.isfinite(p.linear[r]) for v, r in p.rep.items()},
        stats,
    )
