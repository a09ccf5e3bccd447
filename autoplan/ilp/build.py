r"""Stage 5a, ILP build: the integer program whose optimum is the plan.

Input: a :class:`~autoplan.cost.price.CostTable` (plus which strategies each
node may keep, and a memory budget). Output: an :class:`IlpModel` holding a
PuLP problem and the variables the solution is read from.

The math (microseconds of estimated step time)::

    variables   s[v,i] ∈ {0,1}       node v runs strategy i          (add_node_vars)
                e[uv,r,c] ∈ [0,1]    edge uv moves placement r -> c   (add_edges)

    one strategy per node     Σ_i s[v,i] = 1                                 (add_node_vars)
    edge linearization        Σ_c e[uv,r,c] = Σ_{i: out(u,i)=r} s[u,i]       (add_edges)
                              Σ_r e[uv,r,c] = Σ_{j: in(v,j)=c}  s[v,j]
    memory per device         Σ_p Σ_i M[p,i] · s[p,i] ≤ budget               (add_memory)
    tied layers (optional)    s[v,i] ≡ s[rep(v),i]; tied edges share e, cost × count  (add_edges)

    minimize   Σ_v Σ_i C[v,i] · s[v,i]  +  Σ_uv Σ_rc R[uv,r,c] · e[uv,r,c]

Rows r and columns c are *distinct placements* of the tensor on each side,
not strategies: R depends only on the placement pair, so the linearization
of s[u,i]·s[v,j] is exact over placement groups and much smaller. With s
integral, the two sums fix the group indicators to 0/1 and force e to their
product, so e may be continuous. An infinite R[r,c] (a move DTensor cannot
make) has no variable: if no finite column is left for a row, the row's
group cannot be chosen. When one side of an edge has a single placement the
edge cost is folded into the other side's linear cost and no e exists.
Gradient edges (slot -1) tie a parameter's gradient to the parameter's
placement: the price of that move is the gradient reduction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pulp

from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.cluster import edge_key


@dataclass
class IlpModel:
    """A built PuLP problem and the handles to read a solution from."""

    problem: pulp.LpProblem
    choice_vars: dict[str, list[pulp.LpVariable | None]]
    allowed: dict[str, np.ndarray]
    fixed_cost: float
    num_variables: int
    num_constraints: int
    infeasible: str = ""


class _Builder:
    """Builds the ILP; nodes tied by ``rep`` share one set of variables."""

    def __init__(
        self,
        costs: CostTable,
        allowed: Mapping[str, np.ndarray],
        rep: Mapping[str, str],
        edge_keys: Mapping[int, str],
    ) -> None:
        self.costs = costs
        self.edge_keys = edge_keys
        self.tied = any(v != r for v, r in rep.items())
        self.rep = dict(rep)
        self.allowed: dict[str, np.ndarray] = {}
        self.linear: dict[str, np.ndarray] = {}
        for v, c in costs.compute.items():
            r = self.rep.setdefault(v, v)
            ok = np.asarray(allowed[v], dtype=bool)
            if r in self.allowed:
                self.allowed[r] &= ok
                self.linear[r] = self.linear[r] + c
            else:
                self.allowed[r] = ok.copy()
                self.linear[r] = c.astype(np.float64).copy()
        self.problem = pulp.LpProblem("autoplan", pulp.LpMinimize)
        self.vars: dict[str, list[pulp.LpVariable | None]] = {}
        self.objective: dict[pulp.LpVariable, float] = {}
        self.fixed = 0.0
        self.num_vars = 0
        self.num_cons = 0
        self.infeasible = ""

    def single(self, v: str) -> int | None:
        """Index of the only allowed strategy of v's class, or None when it has a choice."""
        idx = np.flatnonzero(self.allowed[self.rep[v]])
        return int(idx[0]) if len(idx) == 1 else None

    def add_node_vars(self) -> None:
        for r, ok in self.allowed.items():
            if not ok.any():
                raise ValueError(f"node {r} has no allowed strategy")
            if self.single(r) is not None:
                self.vars[r] = [None] * len(ok)
                continue
            xs = [
                self.problem.add_variable(f"s_{len(self.vars)}_{i}", 0, 1, cat=pulp.LpBinary)
                if ok[i]
                else None
                for i in range(len(ok))
            ]
            self.vars[r] = xs
            self.num_vars += int(ok.sum())
            self.problem += pulp.lpSum(x for x in xs if x is not None) == 1
            self.num_cons += 1

    def node_vars(self, v: str) -> list[pulp.LpVariable | None]:
        return self.vars[self.rep[v]]

    def _group_expr(self, v: str, group: np.ndarray, g: int) -> list[pulp.LpVariable]:
        return [x for i, x in enumerate(self.node_vars(v)) if x is not None and group[i] == g]

    def _fold(self, edge: EdgeCost, count: int = 1) -> bool:
        """Fold an edge with a fixed side into the other side's linear cost."""
        su, sv = self.single(edge.src), self.single(edge.dst)
        if su is None and sv is None:
            return False
        if su is not None and sv is not None:
            c = edge.cost[edge.src_group[su], edge.dst_group[sv]]
            if not math.isfinite(c):
                raise ValueError(
                    f"edge {edge.src} -> {edge.dst}: the only allowed placements cannot be "
                    "redistributed into each other"
                )
            self.fixed += c * count
            return True
        if su is not None:
            extra = edge.cost[edge.src_group[su]][edge.dst_group]
            target = self.rep[edge.dst]
        else:
            extra = edge.cost[:, edge.dst_group[sv]][edge.src_group]
            target = self.rep[edge.src]
        bad = ~np.isfinite(extra)
        self.allowed[target] &= ~bad
        if not self.allowed[target].any():
            raise ValueError(
                f"edge {edge.src} -> {edge.dst}: no strategy of {target} can take or give "
                "the placement fixed on the other side"
            )
        self.linear[target] = self.linear[target] + np.where(bad, 0.0, extra) * count
        for i in np.flatnonzero(bad):
            x = self.vars.get(target, [None] * len(bad))[i]
            if x is not None:
                x.upBound = 0
        return True

    def add_edges(self) -> None:
        # Tied edges (same classes at both ends, same prices) share variables:
        # count them once, weighted by how many there are.
        grouped: dict[tuple[str, str, str], list[EdgeCost]] = {}
        for e in self.costs.edges:
            # Untied edges never share variables: no need to hash their prices.
            price_key = self.edge_keys.get(id(e)) or (edge_key(e) if self.tied else str(id(e)))
            key = (self.rep[e.src], self.rep[e.dst], price_key)
            grouped.setdefault(key, []).append(e)
        # Fold first (it may remove strategies), then create node variables.
        pending = [(es[0], len(es)) for es in grouped.values() if not self._fold(es[0], len(es))]
        self.add_node_vars()
        for e, count in pending:
            self._add_edge(e, count)

    def _add_edge(self, edge: EdgeCost, count: int) -> None:
        if self._fold(edge, count):
            return
        rows, cols = edge.cost.shape
        by_row: list[list[pulp.LpVariable]] = [[] for _ in range(rows)]
        by_col: list[list[pulp.LpVariable]] = [[] for _ in range(cols)]
        k = self.num_vars
        for r in range(rows):
            for c in range(cols):
                cost = edge.cost[r, c]
                if math.isfinite(cost):
                    x = self.problem.add_variable(f"e_{k}_{r}_{c}", 0, 1)
                    k += 1
                    by_row[r].append(x)
                    by_col[c].append(x)
                    if cost:
                        self.objective[x] = float(cost) * count
        self.num_vars = k
        for r in range(rows):
            members = self._group_expr(edge.src, edge.src_group, r)
            if by_row[r] or members:
                self.problem += pulp.lpSum(by_row[r]) == pulp.lpSum(members)
                self.num_cons += 1
        for c in range(cols):
            members = self._group_expr(edge.dst, edge.dst_group, c)
            if by_col[c] or members:
                self.problem += pulp.lpSum(by_col[c]) == pulp.lpSum(members)
                self.num_cons += 1

    def add_memory(self, budget_bytes: float | None) -> None:
        if budget_bytes is None or not self.costs.memory:
            return
        coef: dict[pulp.LpVariable, float] = {}
        for p, mem in self.costs.memory.items():
            only = self.single(p)
            if only is not None:
                budget_bytes -= float(mem[only])
                continue
            for i, x in enumerate(self.node_vars(p)):
                if x is not None:
                    coef[x] = coef.get(x, 0.0) + float(mem[i])
        if not coef:
            if budget_bytes < 0:
                self.infeasible = "memory_budget: the forced placements alone exceed the budget"
            return
        self.problem += pulp.LpAffineExpression(coef) <= budget_bytes, "memory_budget"
        self.num_cons += 1

    def set_objective(self) -> None:
        terms = dict(self.objective)
        for r, xs in self.vars.items():
            only = self.single(r)
            if only is not None:
                self.fixed += float(self.linear[r][only])
                continue
            for i, x in enumerate(xs):
                if x is not None:
                    terms[x] = terms.get(x, 0.0) + float(self.linear[r][i])
        self.problem += pulp.LpAffineExpression(terms) + self.fixed

    def choice_vars(self) -> dict[str, list[pulp.LpVariable | None]]:
        return {v: self.vars[r] for v, r in self.rep.items()}

    def node_allowed(self) -> dict[str, np.ndarray]:
        return {v: self.allowed[r] for v, r in self.rep.items()}


def build_ilp(
    costs: CostTable,
    *,
    allowed: Mapping[str, np.ndarray] | None = None,
    memory_budget_bytes: float | None = None,
    tie: Mapping[str, str] | None = None,
    edge_keys: Mapping[int, str] | None = None,
) -> IlpModel:
    """Build the ILP of the module docstring for ``costs``.

    ``allowed[v]`` masks node v's strategies (user placement constraints);
    missing nodes allow all. ``tie[v] = r`` makes v use r's variables (see
    :mod:`autoplan.ilp.cluster`): tied nodes must have the same strategy list.
    ``edge_keys`` are the clustering's edge price keys, so they are hashed once.
    """
    mask = {v: np.isfinite(c) for v, c in costs.compute.items()}
    for v, a in (allowed or {}).items():
        if v in mask:
            mask[v] = mask[v] & np.asarray(a, dtype=bool)
    b = _Builder(costs, mask, tie or {}, edge_keys or {})
    b.add_edges()
    b.add_memory(memory_budget_bytes)
    b.set_objective()
    return IlpModel(
        b.problem,
        b.choice_vars(),
        b.node_allowed(),
        b.fixed,
        b.num_vars,
        b.num_cons,
        infeasible=b.infeasible,
    )
