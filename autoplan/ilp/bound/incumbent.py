"""Stage 5c (bound), incumbent: a good feasible plan from the relaxation, in numpy.

Input: a reduced :class:`~autoplan.ilp.formulation.problem.Problem` and either the LP
relaxation's values of each class's strategy variables (:func:`from_lp`) or a
plan decoded from the dual bound, which may exceed the memory budget
(:func:`from_plan`). Output: one strategy per class that meets every
constraint, and its exact cost; or None.

Why: the solver proves optimality faster the closer its first solution is to
the optimum. The solve step uses this plan twice: as the MIP's warm start,
and as the upper bound that lets it drop every variable whose LP reduced cost
says it cannot be part of a cheaper plan (:mod:`autoplan.ilp.solver.solve`).

How: the LP relaxation of this ILP is integral except around the memory row
(the knapsack), where a class mixes a big and a small footprint. Each class
takes, of the strategies the LP uses, the one with the smallest footprint
(so the budget still holds), else the one the LP weighs most; then rounds of
one-class moves take the cheapest strategy of each class given the others,
within the budget, until none improves. A decoded plan over the budget first
sheds memory, one weight class at a time, where that costs least per byte saved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np

from autoplan.cost.price import EdgeCost
from autoplan.ilp.formulation.problem import Edge, Problem
from autoplan.ilp.tolerances import LP_USED, ROUNDING_RTOL


def cost_of(p: Problem, choice: dict[str, int]) -> float:
    """The objective of ``choice`` (one strategy per class); inf if a move is impossible."""
    return priced(p.linear, p.edges, choice)


def memory_of(p: Problem, choice: dict[str, int]) -> float:
    return footprint(p.memory, choice)


def priced(
    linear: Mapping[str, np.ndarray], edges: Iterable[Edge | EdgeCost], choice: Mapping[str, int]
) -> float:
    """Per-strategy prices plus edge prices of ``choice``: of classes (a :class:`Problem`'s
    ``linear`` and edges) or of nodes (a cost table's ``compute`` and edges)."""
    total = sum(float(linear[r][i]) for r, i in choice.items())
    for e in edges:
        price = float(e.cost[e.src_group[choice[e.src]], e.dst_group[choice[e.dst]]])
        total += price * e.scale if isinstance(e, Edge) else price
    return total


def footprint(memory: Mapping[str, np.ndarray], choice: Mapping[str, int]) -> float:
    """The memory row's left-hand side for ``choice``."""
    return sum(float(m[choice[r]]) for r, m in memory.items())


def _options(p: Problem, r: str, choice: dict[str, int], edges: list[tuple[Edge, bool]]):
    """Cost of each strategy of class r with every other class held at ``choice``."""
    total = p.linear[r].copy()
    for e, is_src in edges:
        if is_src:
            col = e.prices((slice(None), e.dst_group[choice[e.dst]]))
            total += np.where(e.src_group >= 0, col[np.maximum(e.src_group, 0)], np.inf)
        else:
            row = e.prices(e.src_group[choice[e.src]])
            total += np.where(e.dst_group >= 0, row[np.maximum(e.dst_group, 0)], np.inf)
    return total


def _improve(
    p: Problem,
    choice: dict[str, int],
    rounds: int,
    incident: dict[str, list[tuple[Edge, bool]]] | None = None,
) -> None:
    incident = incident if incident is not None else p.incident()
    budget = p.budget if p.budget is not None and p.memory else None
    used = memory_of(p, choice) if budget is not None else 0.0
    for _ in range(rounds):
        moved = False
        for r in p.linear:
            if np.isfinite(p.linear[r]).sum() < 2:
                continue
            cost = _options(p, r, choice, incident[r])
            if budget is not None and r in p.memory:
                room = budget - (used - p.memory[r][choice[r]])
                cost = np.where(p.memory[r] <= room, cost, np.inf)
            best = int(np.argmin(cost))
            if cost[best] < cost[choice[r]] - ROUNDING_RTOL * max(1.0, abs(cost[best])):
                if budget is not None and r in p.memory:
                    used += p.memory[r][best] - p.memory[r][choice[r]]
                choice[r] = best
                moved = True
        if not moved:
            return


def from_lp(
    p: Problem, values: dict[str, np.ndarray], *, rounds: int = 5
) -> tuple[dict[str, int], float] | None:
    """Round LP ``values`` (per class, one per strategy) to a feasible plan and improve it:
    the cheaper of two roundings, each class on the smallest footprint the LP uses, or
    on the strategy the LP weighs most (brought within the budget by :func:`from_plan`).
    The second wins when the LP mixes two whole plans (one layout at 95 %, another at
    5 %): taking each class's leaner strategy then joins halves of two plans.

    When no class's values use two strategies, both start from the same plan and the
    first alone is made.

    Returns (choice per class, cost), or None when both roundings break a constraint.
    """
    lean = _leanest(p, values, rounds)
    if not any((v > LP_USED).sum() > 1 for v in values.values()):
        return lean
    heaviest = {
        r: int(np.argmax(np.where(np.isfinite(cost), values.get(r, np.isfinite(cost)), -1.0)))
        for r, cost in p.linear.items()
    }
    found = [f for f in (lean, from_plan(p, heaviest, rounds=rounds)) if f]
    return min(found, key=lambda f: f[1]) if found else None


def _leanest(
    p: Problem, values: dict[str, np.ndarray], rounds: int
) -> tuple[dict[str, int], float] | None:
    """:func:`from_lp`'s rounding to the smallest footprint each class's LP values use."""
    choice: dict[str, int] = {}
    for r, cost in p.linear.items():
        ok = np.isfinite(cost)
        v = np.where(ok, values.get(r, ok.astype(float)), -1.0)
        used = v > LP_USED
        if r in p.memory and used.sum() > 1:
            mem = np.where(used, p.memory[r], np.inf)
            choice[r] = int(np.argmin(mem))
        else:
            choice[r] = int(np.argmax(v))
    _agree(p, choice, values)
    if p.budget is not None and p.memory and memory_of(p, choice) > p.budget:
        return None
    if not np.isfinite(cost_of(p, choice)):
        return None
    _improve(p, choice, rounds)
    return choice, cost_of(p, choice)


def _agree(p: Problem, choice: dict[str, int], values: dict[str, np.ndarray] | None = None) -> None:
    """Move each group of classes whose strategies come in blocks (``p.blocks``) to one
    block: of those the LP ``values`` use, the one with the smallest footprint; without
    values, the block most of them hold. A class keeps its strategy's place in the block
    (the cheapest allowed one there when that place is not)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for r, (group, _) in p.blocks.items():
        if r in choice:
            groups[group].append(r)
    for members in groups.values():
        _agree_group(p, choice, members, values)


def _agree_group(
    p: Problem, choice: dict[str, int], members: list[str], values: dict[str, np.ndarray] | None
) -> None:
    """:func:`_agree` for one group."""
    width = {r: p.blocks[r][1] for r in members}
    count = len(p.linear[members[0]]) // width[members[0]]

    def at(r: str, b: int) -> int:
        return b * width[r] + choice[r] % width[r]

    def score(b: int) -> float:
        if values is None:  # the block most members hold
            return -sum(choice[r] // width[r] == b for r in members)
        return sum(float(p.memory[r][at(r, b)]) for r in members if r in p.memory)

    blocks = list(range(count))
    if values is not None:
        used = [
            b
            for b in blocks
            if any(
                values[r][b * width[r] : (b + 1) * width[r]].sum() > LP_USED
                for r in members
                if r in values
            )
        ]
        blocks = used or blocks
    best = min(blocks, key=lambda b: (score(b), b))
    for r in members:
        j = at(r, best)
        if not np.isfinite(p.linear[r][j]):
            block = p.linear[r][best * width[r] : (best + 1) * width[r]]
            if not np.isfinite(block).any():
                continue
            j = best * width[r] + int(np.argmin(block))
        choice[r] = j


def from_plan(
    p: Problem, choice: dict[str, int], *, rounds: int = 5
) -> tuple[dict[str, int], float] | None:
    """``choice`` brought within the budget and improved; (choice, cost), or None when
    it breaks an edge or no footprint-lowering move is left.

    Over the budget, the move that saves memory at the least cost per byte (one weight
    class to a smaller footprint, the rest held) is made until the plan fits.
    """
    choice = dict(choice)
    _agree(p, choice)
    if not np.isfinite(cost_of(p, choice)):
        return None
    incident = p.incident()
    if p.budget is not None and p.memory:
        used = memory_of(p, choice)
        while used > p.budget:
            best, pick = np.inf, None
            for r, mem in p.memory.items():
                cost = _options(p, r, choice, incident[r])
                saved = mem[choice[r]] - mem
                rate = np.where(
                    saved > 0, (cost - cost[choice[r]]) / np.maximum(saved, 1.0), np.inf
                )
                j = int(np.argmin(rate))
                if rate[j] < best:
                    best, pick = float(rate[j]), (r, j)
            if pick is None:
                return None
            r, j = pick
            used -= p.memory[r][choice[r]] - p.memory[r][j]
            choice[r] = j
    _improve(p, choice, rounds, incident)
    return choice, cost_of(p, choice)
