"""Stage 5e (solve), modes: branch on each layer group's checkpointing mode before the MIP.

Input: an :class:`~autoplan.ilp.formulation.build.IlpModel` whose classes come in mode
blocks (``Problem.blocks``, :mod:`autoplan.memory.layer_modes`), its relaxation, the cost a plan
must beat, and two steps of the solver: a relaxation of a model and a MIP over one.
Output: an :class:`Outcome`, the cheapest plan below that cost and a proven bound
(:func:`branch_modes`).

Why: with ``activation_checkpointing: auto`` every class of a layer group takes one of
the group's modes, and a budget makes the LP relaxation mix them (part of the layer
kept, part recomputed): on the tiny LLaMA under 0.002 GiB the tied LP's bound is
747.16 us, while the plans in one mode alone bound at 823.36, 805.09 and 752.63 us. The
MIP branches on single strategy columns, which never separates the modes: CBC took 19 s
of CPU and 14 nodes of 1 000 simplex iterations each to prove the optimum 757.15 us.
Fixing a group's mode per branch gives each branch its own relaxation (the dual ascent
of :mod:`autoplan.ilp.bound`, cheap) and its own reduced-cost fixing: the branches whose
bound passes the best plan go without a MIP, and the MIP of the one left keeps few
columns (0.45 s there).

How, exactly: a best-first branch and bound over the modes of the groups the LP mixes.
A node is the model with some groups' modes fixed (:func:`restrict`), bounded by its
relaxation; the node of lowest bound is taken next, pruned when its bound reaches the
best plan's cost (less ``mip_gap``), split over the modes of the group its LP mixes
most, or, when its LP mixes none, handed to the MIP with the best plan's cost as cutoff.
Every plan of the model lies in exactly one leaf, so the best plan found is the MIP's
optimum. Past ``_MAX_RELAXATIONS`` the nodes left are solved by the MIP as they are,
which keeps a model with many free groups from branching without end; a search that
proves nothing (the untie stage's passes) stops after ``max_leaves`` MIPs instead. Every
step is a fixed amount of work, so the result is the same on any machine.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from autoplan.ilp.bound.relax import Relaxation
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.formulation.matrix import Emitted, Flow
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.tolerances import MODES_MIXED

__all__ = ["Outcome", "branch_modes", "mode_groups", "restrict"]

# Relaxations the branching may run before it hands every node left to the MIP as it is:
# each costs a dual ascent and an LP or two; three groups branched in full take 39.
_MAX_RELAXATIONS = 40

# The worse of two ways a search can end (an unfinished search is not optimal).
_RANK = {"optimal": 0, "infeasible": 0, "node_limit": 1, "time_limit": 2}


@dataclass(frozen=True)
class Outcome:
    """How a search below a cost ended: ``choice`` the cheapest plan it found below that
    cost (None: none; a strategy per class), ``cost`` its cost (inf without one),
    ``bound`` a lower bound on every plan of the model that is cheaper than the cost
    searched below; ``status`` "optimal" (searched to the end, up to the gap allowed),
    "infeasible" (no plan at all), "node_limit" or "time_limit" (stopped early);
    ``out_of_time`` whether the time limit cut a step short."""

    choice: dict[str, int] | None
    cost: float
    bound: float
    status: str
    out_of_time: bool = False


# relax(model, the model it restricts, that one's relaxation, a bound enough to prune it)
Relax = Callable[[IlpModel, IlpModel, Relaxation, float], Relaxation]
Leaf = Callable[[IlpModel, Relaxation, float], Outcome]


def mode_groups(p: Problem) -> dict[str, list[str]]:
    """Each group of classes that share a mode and its classes, in the problem's order."""
    groups: dict[str, list[str]] = {}
    for r, (group, _) in p.blocks.items():
        if r in p.linear:
            groups.setdefault(group, []).append(r)
    return groups


def _open_modes(p: Problem, members: list[str]) -> list[int]:
    """The modes every class of a group can still take."""
    first = members[0]
    count = len(p.linear[first]) // p.blocks[first][1]
    return [
        k
        for k in range(count)
        if all(
            np.isfinite(p.linear[r][k * p.blocks[r][1] : (k + 1) * p.blocks[r][1]]).any()
            for r in members
        )
    ]


def _mixed(p: Problem, relaxed: Relaxation, groups: dict[str, list[str]]) -> str | None:
    """The group whose modes the relaxation's LP mixes most (None: it mixes none, by
    :data:`~autoplan.ilp.tolerances.MODES_MIXED`): the largest share left outside each
    class's most used mode, first group on ties."""
    values = relaxed.lp_values
    if values is None:
        return None
    pick, most = None, MODES_MIXED
    for group, members in groups.items():
        for r in members:
            width = p.blocks[r][1]
            shares = values[r].reshape(-1, width).sum(axis=1)
            outside = float(shares.sum() - shares.max())
            if outside > most:
                pick, most = group, outside
    return pick


def restrict(model: IlpModel, members: list[str], mode: int) -> IlpModel | None:
    """``model`` with the classes ``members`` (a group) in mode ``mode`` only; None when
    the budget rules out every plan left.

    The matrix is the model's without the columns of the strategies left out: the same
    rows, the edges as they are (a group no allowed strategy maps to is a row that holds
    its moves at 0, and their price is infinite, so the fixing leaves them out), and the
    ascent on the restriction can start from the model's messages, which are over the
    same groups (``seed`` of :func:`~autoplan.ilp.bound.relax.relax`).
    """
    p = model.reduced
    linear = dict(p.linear)
    for r in members:
        width = p.blocks[r][1]
        block = np.arange(len(linear[r])) // width
        linear[r] = np.where(block == mode, linear[r], np.inf)
    if p.budget is not None and p.memory:
        least = sum(float(m[np.isfinite(linear[r])].min()) for r, m in p.memory.items())
        if least > p.budget:
            return None
    q = replace(p, linear=linear, edges=list(p.edges))
    allowed = {v: np.isfinite(q.linear[r]) for v, r in q.rep.items()}
    return IlpModel(_without(model.emitted, linear), q, allowed, dict(model.stats))


def _without(em: Emitted, linear: dict[str, np.ndarray]) -> Emitted:
    """``em`` without the columns of the strategies ``linear`` no longer allows; every
    strategy column comes before every edge column, so the edges' shift by one count."""
    keep = np.ones(em.matrix.num_cols, dtype=bool)
    for r, cols in em.class_cols.items():
        keep[cols[(cols >= 0) & ~np.isfinite(linear[r])]] = False
    new = np.cumsum(keep) - 1  # a kept column's place among the kept
    gone = int((~keep).sum())
    class_cols = {
        r: np.where(cols >= 0, np.where(keep[cols], new[cols], -1), -1)
        for r, cols in em.class_cols.items()
    }
    edge_cols: list[np.ndarray | Flow] = [
        replace(c, first_col=c.first_col - gone)
        if isinstance(c, Flow)
        else np.where(c >= 0, c - gone, -1)
        for c in em.edge_cols
    ]
    return Emitted(em.matrix.columns(keep), class_cols, edge_cols, em.infeasible, dict(em.fixed))


def branch_modes(
    model: IlpModel,
    relaxed: Relaxation,
    *,
    below: float,
    mip_gap: float,
    relax: Relax,
    leaf: Leaf,
    max_leaves: int | None = None,
) -> Outcome:
    """The cheapest plan of ``model`` below cost ``below`` (see the module docstring):
    ``relaxed`` is the model's relaxation, ``relax`` relaxes a restricted model and
    ``leaf(model, relaxed, cost)`` runs the MIP of one for a plan below ``cost``. A
    search that proves nothing (the untie stage's) gives ``max_leaves``: past that many
    MIPs the nodes left are not searched, and the outcome says ``node_limit``."""
    groups = mode_groups(model.reduced)
    best: dict[str, int] | None = None
    best_cost = math.inf
    status, floor, out_of_time = "optimal", math.inf, relaxed.out_of_time
    relaxations = leaves = 0

    def upper() -> float:
        return min(below, best_cost)

    # (bound, order made, model, relaxation, groups fixed): the order breaks ties
    heap = [(_bound(relaxed, -math.inf), 0, model, relaxed, frozenset[str]())]
    made = 1
    while heap:
        bound, _, node, rel, fixed = heap[0]
        cap = upper()
        if math.isfinite(cap) and bound >= cap - mip_gap * abs(cap):
            break  # this node and every one after it cannot hold a cheaper plan
        if max_leaves is not None and leaves >= max_leaves:
            status = max(status, "node_limit", key=_RANK.__getitem__)
            break  # a search's work is done: the nodes left go unsearched
        heapq.heappop(heap)
        free = {g: m for g, m in groups.items() if g not in fixed}
        group = _mixed(node.reduced, rel, free) if relaxations < _MAX_RELAXATIONS else None
        if group is None:
            leaves += 1
            found = leaf(node, rel, cap)
            out_of_time |= found.out_of_time
            if found.choice is not None and found.cost < upper():
                best, best_cost = found.choice, found.cost
            if found.status not in ("optimal", "infeasible"):
                status = max(status, found.status, key=_RANK.__getitem__)
                floor = min(floor, found.bound)
            continue
        for mode in _open_modes(node.reduced, free[group]):
            child = restrict(node, free[group], mode)
            if child is None:
                continue
            cap = upper()
            crel = relax(child, node, rel, cap - mip_gap * abs(cap))
            relaxations += 1
            out_of_time |= crel.out_of_time
            if crel.choice is not None and crel.upper < upper():  # below what it must beat
                best, best_cost = crel.choice, crel.upper
            entry = (_bound(crel, bound), made, child, crel, fixed | {group})
            heapq.heappush(heap, entry)
            made += 1
    left = heap[0][0] if heap else math.inf
    bound = min(floor, left, upper())
    if best is None and not math.isfinite(below) and status == "optimal":
        status = "infeasible"  # every leaf searched to the end, with no cost to beat
    return Outcome(best, best_cost, bound, status, out_of_time)


def _bound(relaxed: Relaxation, parent: float) -> float:
    """A node's bound: its relaxation's, never below its parent's (nan: the parent's)."""
    return parent if math.isnan(relaxed.bound) else max(parent, relaxed.bound)
