r"""Stage 5a, ILP build: the integer program whose optimum is the plan.

Input: a :class:`~autoplan.cost.price.CostTable` (plus which strategies each
node may keep, the tie map of repeated layers and a memory budget). Output:
an :class:`IlpModel` holding a PuLP problem and the variables the solution is
read from.

The math (microseconds of estimated step time)::

    variables   s[r,i] ∈ {0,1}       class r runs strategy i          (_Emitter.node_vars)
                e[uv,g,h] ∈ [0,1]    edge uv moves group g -> group h  (_Emitter.edge_vars)

    one strategy per class    Σ_i s[r,i] = 1                                 (_Emitter.node_vars)
    edge linearization        Σ_h e[uv,g,h] = Σ_{i: grp(u,i)=g} s[u,i]       (_Emitter.edge_vars)
                              Σ_g e[uv,g,h] = Σ_{j: grp(v,j)=h} s[v,j]
    memory per device         Σ_r Σ_i M[r,i] · s[r,i] ≤ budget               (_Emitter.memory_row)

    minimize   Σ_r Σ_i L[r,i] · s[r,i]  +  Σ_uv Σ_gh R[uv,g,h] · e[uv,g,h]

A class r is a node, or the nodes of repeated layers tied to one
representative (:mod:`autoplan.ilp.cluster`); L sums its members' compute,
R is a tied edge's price times the number of edges it stands for.
Groups g, h are *distinct price rows and columns* of the edge, not
strategies: R depends only on the placement pair, so the linearization of
s[u,i]·s[v,j] is exact over groups and much smaller. With s integral, the two
sums fix the group indicators to 0/1 and force e to their product, so e may
be continuous. An infinite price (a move DTensor cannot make) has no
variable. One column sum per edge is implied by the others and left out.
Gradient edges (slot -1) tie a parameter's gradient to the parameter's
placement: the price of that move is the gradient reduction.

Before any PuLP object is made, :mod:`autoplan.ilp.problem` folds edges that
do not couple two choices into L and :mod:`autoplan.ilp.prune` removes
dominated strategies; both keep the optimum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pulp

from autoplan.cost.price import CostTable
from autoplan.ilp.problem import Edge, Problem, lower, simplify
from autoplan.ilp.prune import prune_dominated

# The memory row is written in MiB: byte-sized coefficients (1e9) sit badly
# with the simplex's absolute tolerances.
_MEMORY_UNIT = 2.0**20


@dataclass
class IlpModel:
    """A built PuLP problem and the handles to read a solution from.

    ``choice_vars[v][i]`` is node v's (its class's) variable for strategy i,
    None when i cannot be chosen or the class has one strategy left;
    ``allowed[v]`` marks the strategies still allowed; ``stats`` counts what
    the reductions removed. ``reduced`` is the numpy problem the model was
    emitted from, ``class_vars[r]`` its class r's variables and ``edge_vars[k]``
    the variables of its k-th edge by (row, column).
    """

    problem: pulp.LpProblem
    choice_vars: dict[str, list[pulp.LpVariable | None]]
    allowed: dict[str, np.ndarray]
    fixed_cost: float
    num_variables: int
    num_constraints: int
    infeasible: str = ""
    stats: dict[str, int] = field(default_factory=dict)
    reduced: Problem | None = None
    class_vars: dict[str, list[pulp.LpVariable | None]] = field(default_factory=dict)
    edge_vars: list[dict[tuple[int, int], pulp.LpVariable]] = field(default_factory=list)


class _Emitter:
    """Turns a simplified :class:`Problem` into PuLP variables and rows."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        self.problem = pulp.LpProblem("autoplan", pulp.LpMinimize)
        self.vars: dict[str, list[pulp.LpVariable | None]] = {}
        self.edge_vars: list[dict[tuple[int, int], pulp.LpVariable]] = []
        self.objective: list[tuple[pulp.LpVariable, float]] = []
        self.fixed = 0.0
        self.num_vars = 0
        self.num_cons = 0
        self.infeasible = ""

    def _row(self, terms: list[tuple[pulp.LpVariable, float]], sense: int, rhs: float) -> None:
        self.problem.addConstraint(
            pulp.LpConstraint(pulp.LpAffineExpression(terms), sense=sense, rhs=rhs),
            name=f"c{self.num_cons}",
        )
        self.num_cons += 1

    def node_vars(self) -> None:
        for r, cost in self.p.linear.items():
            idx = np.flatnonzero(np.isfinite(cost))
            xs: list[pulp.LpVariable | None] = [None] * len(cost)
            if len(idx) == 1:
                self.fixed += float(cost[idx[0]])
            else:
                k = len(self.vars)
                for i in idx:
                    x = self.problem.add_variable(f"s_{k}_{i}", 0, 1, pulp.LpBinary)
                    xs[i] = x
                    if cost[i]:
                        self.objective.append((x, float(cost[i])))
                self.num_vars += len(idx)
                self._row([(xs[i], 1.0) for i in idx], pulp.LpConstraintEQ, 1.0)
            self.vars[r] = xs

    def edge_vars_of(self, num: int, e: Edge) -> None:
        rows, cols = e.cost.shape
        by_row: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in range(rows)]
        by_col: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in range(cols)]
        made: dict[tuple[int, int], pulp.LpVariable] = {}
        for g, h in zip(*np.nonzero(np.isfinite(e.cost)), strict=True):
            x = self.problem.add_variable(f"e_{num}_{g}_{h}", 0, 1)
            made[int(g), int(h)] = x
            by_row[g].append((x, 1.0))
            by_col[h].append((x, 1.0))
            if e.cost[g, h]:
                self.objective.append((x, float(e.cost[g, h])))
        self.num_vars += len(made)
        self.edge_vars.append(made)
        for i, x in enumerate(self.vars[e.src]):
            if x is not None:
                by_row[e.src_group[i]].append((x, -1.0))
        for j, x in enumerate(self.vars[e.dst]):
            if x is not None:
                by_col[e.dst_group[j]].append((x, -1.0))
        for terms in by_row + by_col[:-1]:  # the last column sum follows from the rest
            self._row(terms, pulp.LpConstraintEQ, 0.0)

    def memory_row(self) -> None:
        p = self.p
        if p.budget is None or not p.memory:
            return
        budget = p.budget
        terms: list[tuple[pulp.LpVariable, float]] = []
        most = 0.0
        for r, mem in p.memory.items():
            ok = np.isfinite(p.linear[r])
            low = float(mem[ok].min())  # a constant, since one strategy is chosen
            budget -= low
            most += float(mem[ok].max()) - low
            xs = self.vars[r]
            terms += [
                (x, (float(mem[i]) - low) / _MEMORY_UNIT) for i, x in enumerate(xs) if x is not None
            ]
        if budget < 0:
            self.infeasible = (
                "memory_budget: the smallest footprint of the allowed placements exceeds the budget"
            )
        elif most > budget:  # otherwise every choice fits and the row is not needed
            self._row([t for t in terms if t[1]], pulp.LpConstraintLE, budget / _MEMORY_UNIT)

    def finish(self) -> None:
        self.problem.setObjective(pulp.LpAffineExpression(self.objective) + self.fixed)


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
    :mod:`autoplan.ilp.cluster`): tied nodes must have the same strategy list.
    ``edge_keys`` are the clustering's edge price keys, so they are hashed once.
    ``prune`` removes dominated strategies first (:mod:`autoplan.ilp.prune`).
    Raises :class:`~autoplan.ilp.problem.InfeasibleError` (a ValueError) naming
    the node or edge when the constraints alone leave no plan.
    """
    p = lower(
        costs,
        allowed=allowed,
        tie=tie,
        edge_keys=edge_keys,
        memory_budget_bytes=memory_budget_bytes,
    )
    simplify(p)
    before = p.num_allowed()
    pruned = prune_dominated(p) if prune else 0
    em = _Emitter(p)
    em.node_vars()
    for k, e in enumerate(p.edges):
        em.edge_vars_of(k, e)
    em.memory_row()
    em.finish()
    stats = {
        "classes": len(p.linear),
        "strategies": before,
        "pruned": pruned,
        "edges": len(p.edges),
    }
    return IlpModel(
        em.problem,
        {v: em.vars[r] for v, r in p.rep.items()},
        {v: np.isfinite(p.linear[r]) for v, r in p.rep.items()},
        em.fixed,
        em.num_vars,
        em.num_cons,
        infeasible=em.infeasible,
        stats=stats,
        reduced=p,
        class_vars=em.vars,
        edge_vars=em.edge_vars,
    )
