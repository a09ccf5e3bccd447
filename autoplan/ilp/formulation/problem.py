"""Stage 5b (formulation), problem: the ILP's data over tied classes, simplified exactly.

Input: a :class:`~autoplan.cost.price.CostTable`, each node's allowed
strategies, the tie map of :mod:`autoplan.ilp.reductions.tying` and the memory budget.
Output: a :class:`Problem` that :mod:`autoplan.ilp.formulation.prune` shrinks further and
:mod:`autoplan.ilp.formulation.matrix` lays out as the solver's arrays.

Why a problem of its own before the arrays: every reduction below is a few array
operations on a class's cost vector or an edge's matrix, and the solver's arrays are
laid out once, from the smallest problem.

A *class* is a set of tied nodes (one node when untied): its strategies
share one set of variables. ``linear[r][i]`` is class r's cost under
strategy i (the compute of all its members plus edge costs folded into it);
``inf`` marks a strategy that cannot be chosen. ``memory[r][i]`` is the
bytes of its parameters. A class :class:`Edge` carries the price matrix the
tied edges it stands for share, and their number as its scale (its prices are
the two multiplied), over the placement groups its two ends can still choose.

Simplifications (each keeps every optimum):

* an edge between two members of one class is a linear cost of that class,
  since both ends take the same strategy;
* rows and columns no allowed strategy maps to are dropped, and a strategy
  whose row (column) has no finite price left cannot be chosen;
* identical rows (columns) are merged: the linearization only needs to know
  which group is chosen, and both groups price every move alike;
* an edge whose one end has a single strategy left is a linear cost of the other;
* an edge with one row, one column, or prices of the form ``a[r] + b[c]`` is
  folded into its ends' linear costs; an all-zero edge is dropped.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoplan.core.by_identity import ByIdentity
from autoplan.core.by_value import ByValue
from autoplan.core.components import components
from autoplan.cost.block_diagonal import BlockDiagonal, Prices, live, taken
from autoplan.cost.price import CostTable
from autoplan.cost.routes import Routes
from autoplan.ilp.formulation.block_compact import Compacted, compact_blocks
from autoplan.ilp.formulation.distinct import distinct_cols, distinct_rows
from autoplan.ilp.reductions.tying import edge_key
from autoplan.ilp.scratch import Scratch
from autoplan.ilp.tolerances import ADDITIVE_RTOL


class InfeasibleError(ValueError):
    """No plan meets the constraints; the message names the node or edge that shows it."""


@dataclass
class Edge:
    """A class edge: ``cost[src_group[i], dst_group[j]] * scale`` when src picks i and dst
    picks j (:meth:`prices`).

    ``name`` is the first graph edge it stands for, for messages; ``sources`` the
    positions in the cost table's ``edges`` of all of them (a dual ascent on another
    problem of the same table finds its own edge by them). Groups of strategies that
    cannot be chosen are ``-1``; ``compact`` says every row and column is used and
    distinct.
    """

    src: str
    dst: str
    src_group: np.ndarray
    dst_group: np.ndarray
    cost: Prices  # dense once compacted (simplify)
    name: str
    compact: bool = False
    # A route-priced edge (cost.routes): cost[g, h] is the network's distance from
    # row_state[g] to col_state[h], so the matrix can lay it out as a flow over the
    # network's moves.
    net: Routes | None = None
    row_state: np.ndarray | None = None
    col_state: np.ndarray | None = None
    # The tied edges a class edge stands for share one matrix (and network): it keeps
    # theirs and their number, as a scaled copy per class would cost the matrices again.
    scale: float = 1.0
    sources: tuple[int, ...] = ()

    def prices(self, index: Any = ...) -> np.ndarray:
        """``cost[index]`` times ``scale``: the class's own prices (:meth:`scaled`)."""
        return self.scaled(self.cost[index])

    def scaled(self, part: np.ndarray) -> np.ndarray:
        """``part``, read from ``cost``, times ``scale``: a new array, or ``part`` itself
        (not to be written) when the scale is 1."""
        return part * self.scale if self.scale != 1.0 else part


@dataclass
class Problem:
    """The ILP's data over classes; :func:`simplify` and the pruner edit it in place."""

    linear: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    edges: list[Edge]
    rep: dict[str, str]
    budget: float | None
    # class -> (group, width): its strategies come in blocks that agree within the group
    # (CostTable.blocks)
    blocks: dict[str, tuple[str, int]] = field(default_factory=dict)

    def allowed(self, r: str) -> np.ndarray:
        return np.isfinite(self.linear[r])

    def num_allowed(self) -> int:
        return int(sum(np.isfinite(c).sum() for c in self.linear.values()))

    def incident(self) -> dict[str, list[tuple[Edge, bool]]]:
        """Per class, its edges and whether the class is their source."""
        out: dict[str, list[tuple[Edge, bool]]] = defaultdict(list)
        for e in self.edges:
            out[e.src].append((e, True))
            out[e.dst].append((e, False))
        return out


def build_problem(
    costs: CostTable,
    *,
    allowed: Mapping[str, np.ndarray] | None = None,
    tie: Mapping[str, str] | None = None,
    edge_keys: Mapping[int, str] | None = None,
    memory_budget_bytes: float | None = None,
) -> Problem:
    """Sum tied nodes and edges into classes (see module docstring); not yet simplified."""
    rep = {v: (tie or {}).get(v, v) for v in costs.compute}
    linear: dict[str, np.ndarray] = {}
    for v, c in costs.compute.items():
        cost = np.asarray(c, dtype=np.float64)
        mask = (allowed or {}).get(v)
        if mask is not None:
            cost = np.where(np.asarray(mask, dtype=bool), cost, np.inf)
        r = rep[v]
        linear[r] = linear[r] + cost if r in linear else cost.copy()
    for r, c in linear.items():
        if not np.isfinite(c).any():
            raise InfeasibleError(f"node {r} has no allowed strategy")
    memory: dict[str, np.ndarray] = {}
    if memory_budget_bytes is not None:
        for p, m in costs.memory.items():
            r = rep[p]
            memory[r] = memory[r] + m if r in memory else np.asarray(m, dtype=np.float64).copy()
    tied = any(v != r for v, r in rep.items())
    grouped: dict[tuple[str, str, str], list[int]] = {}
    for j, e in enumerate(costs.edges):
        # untied edges never share variables: no need to hash their prices
        key = (edge_keys or {}).get(id(e)) or (edge_key(e) if tied else str(j))
        grouped.setdefault((rep[e.src], rep[e.dst], key), []).append(j)
    edges = []
    for (src, dst, _), js in grouped.items():
        es = [costs.edges[j] for j in js]
        e = es[0]
        if src == dst:  # both ends take the same strategy: a linear cost
            linear[src] = linear[src] + e.cost[e.src_group, e.dst_group] * len(es)
            continue
        edges.append(
            Edge(
                src,
                dst,
                e.src_group,
                e.dst_group,
                e.cost,
                f"{e.src} -> {e.dst}",
                net=e.net,
                row_state=e.row_state,
                col_state=e.col_state,
                scale=float(len(es)),
                sources=tuple(js),
            )  # fmt: skip
        )
    return Problem(linear, memory, edges, rep, memory_budget_bytes, _class_blocks(costs, rep))


def _class_blocks(costs: CostTable, rep: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """CostTable.blocks per class: a class takes the group of each of its nodes, and
    groups that share a class are one."""
    joined = components(
        [], (("class:" + rep[v], "group:" + group) for v, (group, _) in costs.blocks.items())
    )
    return {rep[v]: (joined["class:" + rep[v]], width) for v, (_, width) in costs.blocks.items()}


def _used(group: np.ndarray, ok: np.ndarray, size: int) -> np.ndarray:
    used = np.zeros(size, dtype=bool)
    used[group[ok]] = True
    return used


def _forbid(p: Problem, r: str, bad: np.ndarray, why: str) -> bool:
    """Rule out strategies ``bad`` of class r; raise if none is left."""
    bad = bad & p.allowed(r)
    if not bad.any():
        return False
    p.linear[r] = np.where(bad, np.inf, p.linear[r])
    if not p.allowed(r).any():
        raise InfeasibleError(why)
    return True


def _compact(e: Edge, ok_src: np.ndarray, ok_dst: np.ndarray, scratch: Scratch) -> None:
    """Keep the used rows and columns, merging identical ones; regroup the strategies.
    Rows are compared by the class's prices (times the scale, whose rounding can make
    two rows equal), the matrix kept unscaled."""
    rows = _used(e.src_group, ok_src, e.cost.shape[0])
    cols = _used(e.dst_group, ok_dst, e.cost.shape[1])
    if e.compact and rows.all() and cols.all():
        return  # nothing dropped since the last compaction
    done = (
        compact_blocks(e.cost, rows, cols, e.scale) if isinstance(e.cost, BlockDiagonal) else None
    )
    if done is None:
        done = _compact_dense(e, rows, cols, scratch)
    row_first, row_of, col_first, col_of = done.row_first, done.row_of, done.col_first, done.col_of
    if e.row_state is not None and e.col_state is not None:
        # a merged row keeps its first member's state: equal rows are equal distances
        e.row_state = e.row_state[np.flatnonzero(rows)[row_first]]
        e.col_state = e.col_state[np.flatnonzero(cols)[col_first]]
    row_map = np.full(e.cost.shape[0], -1)
    row_map[rows] = row_of
    col_map = np.full(e.cost.shape[1], -1)
    col_map[cols] = col_of
    e.src_group = np.where(ok_src, row_map[e.src_group], -1)
    e.dst_group = np.where(ok_dst, col_map[e.dst_group], -1)
    e.cost = done.cost
    e.compact = True


def _compact_dense(e: Edge, rows: np.ndarray, cols: np.ndarray, scratch: Scratch) -> Compacted:
    """:func:`_compact`'s distinct rows and columns of ``e``'s used ones, as one matrix."""
    sub = taken(e.cost, rows, cols)
    prices = sub if e.scale == 1.0 else np.multiply(sub, e.scale, out=scratch.like(sub.shape))
    row_first, row_of = distinct_rows(prices)
    uniq_rows = prices if len(row_first) == len(prices) else prices[row_first]
    col_first, col_of = distinct_cols(uniq_rows)
    # the matrix stays unscaled: a merged row keeps its first member's
    kept = uniq_rows if e.scale == 1.0 else sub if len(row_first) == len(sub) else sub[row_first]
    cost = np.ascontiguousarray(kept if len(col_first) == kept.shape[1] else kept[:, col_first])
    return Compacted(row_first, row_of, col_first, col_of, cost)


def _fold(p: Problem, e: Edge) -> bool:
    """Fold a one-row, one-column, additive or zero edge into linear costs; True if done."""
    if isinstance(e.cost, BlockDiagonal) or not np.isfinite(e.cost).all():
        return False  # a block diagonal matrix has inf outside its blocks
    if e.cost.shape[0] > 1 and e.cost.shape[1] > 1:
        c = e.prices()
        a, b = c[:, :1], c[:1, :] - c[0, 0]
        if not np.allclose(c, a + b, rtol=ADDITIVE_RTOL, atol=0.0):
            return False
    a, first_row = e.prices((slice(None), 0)), e.prices(0)
    b = first_row - first_row[0]
    ok_s, ok_d = e.src_group >= 0, e.dst_group >= 0
    p.linear[e.src] = p.linear[e.src] + np.where(ok_s, a[np.maximum(e.src_group, 0)], 0.0)
    p.linear[e.dst] = p.linear[e.dst] + np.where(ok_d, b[np.maximum(e.dst_group, 0)], 0.0)
    return True


def _restrict(p: Problem, e: Edge) -> bool:
    """Rule out strategies with no finite move left on ``e``; True if any was."""
    ok_s, ok_d = p.allowed(e.src), p.allowed(e.dst)
    rows = _used(e.src_group, ok_s, e.cost.shape[0])
    cols = _used(e.dst_group, ok_d, e.cost.shape[1])
    row_live, col_live = live(e.cost, rows, cols)
    dead_rows, dead_cols = ~row_live, ~col_live
    why = f"edge {e.name}: no allowed placement on one side can be redistributed into any allowed on the other"
    changed = _forbid(p, e.src, ok_s & dead_rows[e.src_group], why)
    return _forbid(p, e.dst, ok_d & dead_cols[e.dst_group], why) or changed


def _fold_lone_end(p: Problem, e: Edge) -> bool:
    """Fold ``e`` into the other end's linear cost when one end has a single strategy
    left; True if done.

    Called after :func:`_restrict`, so every allowed strategy of the other end has a
    finite move from (to) that strategy. Cheaper than compacting first: an untied
    model narrowed to the LP's support (:mod:`autoplan.ilp.untying.untie`) is mostly such edges.
    """
    ok_s, ok_d = p.allowed(e.src), p.allowed(e.dst)
    if ok_s.sum() == 1:
        prices = e.prices(e.src_group[np.argmax(ok_s)])
        group, other, ok = e.dst_group, e.dst, ok_d
    elif ok_d.sum() == 1:
        prices = e.prices((slice(None), e.dst_group[np.argmax(ok_d)]))
        group, other, ok = e.src_group, e.src, ok_s
    else:
        return False
    p.linear[other] = p.linear[other] + np.where(ok, prices[np.maximum(group, 0)], 0.0)
    return True


def simplify(p: Problem) -> None:
    """Apply the module docstring's simplifications until none applies."""
    changed = True
    while changed:
        changed = False
        for e in p.edges:
            changed |= _restrict(p, e)
    kept = []
    scratch = Scratch()
    for e in p.edges:
        if _fold_lone_end(p, e):
            continue
        _compact(e, p.allowed(e.src), p.allowed(e.dst), scratch)
        if not _fold(p, e):
            kept.append(e)
    p.edges = kept


def share_equal_prices(p: Problem) -> None:
    """One matrix for edges whose compacted prices are equal (tied classes alike, made
    apart): the edges' matrices are read, never written. Only matrices whose shape
    another distinct one has are compared."""
    by_shape: dict[tuple[object, ...], dict[int, np.ndarray]] = defaultdict(dict)
    for e in p.edges:
        if not isinstance(e.cost, BlockDiagonal):
            by_shape[e.cost.dtype.str, e.cost.shape][id(e.cost)] = e.cost
    pool, memo = ByValue(), ByIdentity()
    for e in p.edges:
        m = e.cost
        if isinstance(m, BlockDiagonal):  # block by block; edges that shared one still do
            e.cost = memo.made("blocks", (m,), functools.partial(_interned_blocks, m, pool))
        elif len(by_shape[m.dtype.str, m.shape]) > 1:
            e.cost = pool.interned(m)


def _interned_blocks(m: BlockDiagonal, pool: ByValue) -> BlockDiagonal:
    blocks = tuple(pool.interned(b) for b in m.blocks)
    return (
        m if all(a is b for a, b in zip(blocks, m.blocks, strict=True)) else BlockDiagonal(blocks)
    )


def plain_size(costs: CostTable, budget: bool) -> tuple[int, int]:
    """(variables, constraints) of the ILP without any reduction, for reports.

    One binary per node strategy and one edge variable per finite price;
    one row per node, per edge row and column, and the memory row.
    """
    num_vars = sum(int(np.isfinite(c).sum()) for c in costs.compute.values())
    num_cons = len(costs.compute) + int(budget and bool(costs.memory))
    finite: dict[int, int] = {}  # twin edges share their price matrix: count it once
    for e in costs.edges:
        n = finite.get(id(e.cost))
        if n is None:
            n = finite[id(e.cost)] = int(np.isfinite(e.cost).sum())
        num_vars += n
        num_cons += e.cost.shape[0] + e.cost.shape[1]
    return num_vars, num_cons
