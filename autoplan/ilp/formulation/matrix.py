"""Stage 5b (formulation), matrix: the reduced ILP as arrays a solver reads directly.

Input: a simplified, pruned :class:`~autoplan.ilp.formulation.problem.Problem`. Output: a
:class:`Matrix` (objective, column bounds and integrality, sparse rows in
compressed-column form) and the column index of every class strategy and
every edge move, so a solution vector can be read back per class.

Why arrays and not a modelling layer: one Python object per variable is slow to
make and to write out again on every solver call. Here every class and edge is a
few numpy operations, and the same arrays go to HiGHS in memory or to CBC as an
MPS file (:mod:`autoplan.ilp.backends`).

Columns: first the binary strategy columns of every class with two or more
allowed strategies, then the continuous edge columns: one per finite
placement pair, or, for a route-priced edge whose network has fewer moves
than the edge has pairs, one per move that a cheapest route between the
edge's states can use (a flow). Rows, in order: one "one strategy" row per
class with columns, then per edge its row sums and all but the last column
sum (pairs) or one conservation row per state it touches but one (flow),
and the memory row when the budget can bind. The math is in
:mod:`autoplan.ilp.formulation.build`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from autoplan.cost.routes import Routes
from autoplan.ilp.formulation.problem import Edge, Problem
from autoplan.ilp.tolerances import ROUNDING_RTOL

# The memory row is written in MiB: byte-sized coefficients (1e9) sit badly
# with the simplex's absolute tolerances.
MEMORY_UNIT = 2.0**20


@dataclass
class Matrix:
    """min cost·x + offset  s.t.  row_lower <= A x <= row_upper,  0 <= x <= upper.

    ``A`` is compressed by column: column j's entries are
    ``index[start[j]:start[j+1]]`` (rows) and ``value[...]``. ``integer[j]``
    marks binary columns; ``columns`` keeps a subset (the MIP leaves out the columns
    reduced-cost fixing sets to 0).
    """

    cost: np.ndarray
    upper: np.ndarray
    integer: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray
    offset: float = 0.0

    @property
    def num_cols(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def columns(self, keep: np.ndarray) -> Matrix:
        """The same rows over the columns ``keep`` marks (dropped columns are fixed at 0)."""
        lengths = np.diff(self.start)[keep]
        start = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        take = np.repeat(self.start[:-1][keep] - start[:-1], lengths) + np.arange(start[-1])
        return Matrix(
            cost=self.cost[keep],
            upper=self.upper[keep],
            integer=self.integer[keep],
            row_lower=self.row_lower,
            row_upper=self.row_upper,
            start=start,
            index=self.index[take],
            value=self.value[take],
            offset=self.offset,
        )


@dataclass
class Emitted:
    """A :class:`Matrix` and where each class strategy and edge move lives in it.

    ``class_cols[r][i]`` is the column of class r's strategy i (-1: no column,
    the strategy cannot be chosen or is the class's only one);
    ``edge_cols[k][g, h]`` the column of edge k's move g -> h (-1: impossible), or, for
    an edge laid out as a flow, the :class:`Flow` that finds a move's route columns
    (:meth:`move_columns` answers both).
    ``infeasible`` names a constraint group that no plan can meet.
    """

    matrix: Matrix
    class_cols: dict[str, np.ndarray]
    edge_cols: list[np.ndarray | Flow]
    infeasible: str = ""
    fixed: dict[str, int] = field(default_factory=dict)

    def move_columns(self, k: int, g: int, h: int) -> np.ndarray:
        """The columns that carry edge k's move g -> h (one pair column, or a route's arcs)."""
        cols = self.edge_cols[k]
        if isinstance(cols, Flow):
            return cols.route_columns(g, h)
        return np.array([cols[g, h]])


@dataclass(frozen=True)
class Flow:
    """Where a flow edge lives: its arcs' columns, and how to route one move over them."""

    first_col: int
    net: Routes  # its prices times scale are the edge's
    row_state: np.ndarray
    col_state: np.ndarray
    scale: float = 1.0

    def route_columns(self, g: int, h: int) -> np.ndarray:
        """The arcs of a cheapest route from row g's state to column h's.

        A search along *tight* arcs (price plus price-to-go from the arc's end no more
        than the price-to-go from its start): any path of them is a cheapest route.
        """
        net, a, b = self.net, int(self.row_state[g]), int(self.col_state[h])
        to_b = net.distances(None, np.array([b]))[:, 0]
        tol = ROUNDING_RTOL * max(1.0, float(to_b[a]))
        reached_by = {a: -1}  # state -> the arc it was reached by
        stack = [a]
        while stack and b not in reached_by:
            x = stack.pop()
            out = np.flatnonzero(net.arc_src == x)
            tight = out[net.arc_cost[out] + to_b[net.arc_dst[out]] <= to_b[x] + tol]
            for k in tight:
                y = int(net.arc_dst[k])
                if y not in reached_by:
                    reached_by[y] = int(k)
                    stack.append(y)
        if b not in reached_by:
            raise RuntimeError(f"no route from state {a} to state {b} over the network's arcs")
        arcs, x = [], b
        while x != a:
            arcs.append(reached_by[x])
            x = int(net.arc_src[reached_by[x]])
        return self.first_col + np.array(arcs[::-1], dtype=np.int64)


class _Rows:
    """Collects constraint entries as arrays (COO) and row bounds."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.count = 0

    def new(self, lower: ArrayLike, upper: ArrayLike) -> int:
        """Open ``len(lower)`` rows; returns the first row's index."""
        first = self.count
        self.lower.append(np.asarray(lower, dtype=np.float64))
        self.upper.append(np.asarray(upper, dtype=np.float64))
        self.count += len(self.lower[-1])
        return first

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        self.rows.append(np.asarray(rows, dtype=np.int64))
        self.cols.append(np.asarray(cols, dtype=np.int64))
        self.vals.append(np.broadcast_to(np.asarray(vals, dtype=np.float64), np.shape(rows)))

    def compress(self, num_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, index, value) by column, rows ascending within a column."""
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, dtype=np.int64)
        cols = np.concatenate(self.cols) if self.cols else np.zeros(0, dtype=np.int64)
        vals = np.concatenate(self.vals) if self.vals else np.zeros(0)
        # by column, then row: one int64 key (rows and columns count below 2**31) sorts
        # as lexsort's two keys do, in one pass
        order = np.argsort(cols << 32 | rows, kind="stable")
        counts = np.bincount(cols, minlength=num_cols)
        start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return start, rows[order].astype(np.int32), vals[order]


def emit(p: Problem) -> Emitted:
    """Lay ``p`` out as a :class:`Matrix` (see the module docstring)."""
    costs: list[np.ndarray] = []
    num_cols = 0
    offset = 0.0
    class_cols: dict[str, np.ndarray] = {}
    fixed: dict[str, int] = {}
    rows = _Rows()
    for r, cost in p.linear.items():
        ok = np.isfinite(cost)
        idx = np.flatnonzero(ok)
        cols = np.full(len(cost), -1, dtype=np.int64)
        if len(idx) == 1:
            offset += float(cost[idx[0]])
            fixed[r] = int(idx[0])
        else:
            cols[idx] = num_cols + np.arange(len(idx))
            costs.append(cost[idx])
            num_cols += len(idx)
            row = rows.new([1.0], [1.0])
            rows.add(np.full(len(idx), row), cols[idx], 1.0)
        class_cols[r] = cols
    num_int = num_cols
    edge_cols: list[np.ndarray | Flow] = []
    networks: dict[tuple[int, bytes, bytes], Routes] = {}
    for e in p.edges:
        finite = np.isfinite(e.cost)
        # A flow when the whole network's moves are fewer than the pairs: counting only the
        # moves _flow_network keeps would make flows of small edges, whose rows slow the LP
        if e.net is not None and len(e.net.arc_src) < finite.sum():
            assert e.row_state is not None and e.col_state is not None, "a routed edge has states"
            net = _flow_network(e, networks)
            flow = Flow(num_cols, net, e.row_state, e.col_state, e.scale)
            costs.append(net.arc_cost * e.scale)
            num_cols += len(net.arc_cost)
            _flow_rows(e, flow, class_cols, fixed, rows)
            edge_cols.append(flow)
            continue
        g, h = np.nonzero(finite)
        ecols = np.full(e.cost.shape, -1, dtype=np.int64)
        ecols[g, h] = num_cols + np.arange(len(g))
        costs.append(e.prices((g, h)))
        num_cols += len(g)
        edge_cols.append(ecols)
        num_r, num_c = e.cost.shape
        # Σ_h e[g,h] - Σ_{i in g} s[u,i] = 0 per row g; the same per column h but the last,
        # which the others imply. A class with one strategy left has no column: its
        # indicator is the constant 1 on its own group, which moves to the right-hand side.
        ends = ((e.src, e.src_group, 0, num_r), (e.dst, e.dst_group, num_r, num_c - 1))
        rhs = np.zeros(num_r + num_c - 1)
        for cls, group, base, limit in ends:
            if cls in fixed and group[fixed[cls]] < limit:
                rhs[base + group[fixed[cls]]] = 1.0
        first = rows.new(rhs, rhs)
        rows.add(first + g, ecols[g, h], 1.0)
        keep = h < num_c - 1
        rows.add(first + num_r + h[keep], ecols[g[keep], h[keep]], 1.0)
        for cls, group, base, limit in ends:
            if cls in fixed:
                continue
            cols = class_cols[cls]
            sel = (cols >= 0) & (group >= 0) & (group < limit)
            rows.add(first + base + group[sel], cols[sel], -1.0)
    infeasible = _memory_row(p, class_cols, fixed, rows)
    start, index, value = rows.compress(num_cols)
    cost_vec = np.concatenate(costs) if costs else np.zeros(0)
    matrix = Matrix(
        cost=cost_vec,
        upper=np.ones(num_cols),
        integer=np.arange(num_cols) < num_int,
        row_lower=np.concatenate(rows.lower) if rows.lower else np.zeros(0),
        row_upper=np.concatenate(rows.upper) if rows.upper else np.zeros(0),
        start=start,
        index=index,
        value=value,
        offset=offset,
    )
    return Emitted(matrix, class_cols, edge_cols, infeasible, fixed)


def _flow_network(e: Edge, memo: dict[tuple[int, bytes, bytes], Routes]) -> Routes:
    """The moves edge e's flow may use: those on cheapest routes from its rows to its columns.

    Edges of twin tensors share a network and often their states: ``memo`` (keyed by the
    network's identity, for one :func:`emit`) prunes it once for them.
    """
    assert e.net is not None and e.row_state is not None and e.col_state is not None
    sources, sinks = np.unique(e.row_state), np.unique(e.col_state)
    key = (id(e.net), sources.tobytes(), sinks.tobytes())
    if key not in memo:
        memo[key] = e.net.between(sources, sinks)
    return memo[key]


def _flow_rows(
    e: Edge, flow: Flow, class_cols: dict[str, np.ndarray], fixed: dict[str, int], rows: _Rows
) -> None:
    """One unit of flow from the producer's state to the consumer's, over the arcs.

    Per state q the flow touches, but one (implied by the others): Σ_out f - Σ_in f
    - Σ_{i at q} s[u,i] + Σ_{j at q} s[v,j] = 0, a fixed class's indicator moving to the
    right-hand side.
    """
    net = flow.net
    used = np.zeros(net.size, dtype=bool)
    for states in (net.arc_src, net.arc_dst, flow.row_state, flow.col_state):
        used[states] = True
    row_of = np.full(net.size, -1, dtype=np.int64)
    kept = np.flatnonzero(used)[:-1]
    row_of[kept] = np.arange(len(kept))
    rhs = np.zeros(len(kept))
    ends = ((e.src, e.src_group, flow.row_state, -1.0), (e.dst, e.dst_group, flow.col_state, 1.0))
    for cls, group, state, sign in ends:
        if cls in fixed:
            r = row_of[state[group[fixed[cls]]]]
            if r >= 0:
                rhs[r] -= sign
    first = rows.new(rhs, rhs)
    cols = flow.first_col + np.arange(len(net.arc_src))
    for ends_at, sign in ((net.arc_src, 1.0), (net.arc_dst, -1.0)):
        r = row_of[ends_at]
        rows.add(first + r[r >= 0], cols[r >= 0], sign)
    for cls, group, state, sign in ends:
        if cls in fixed:
            continue
        ccols = class_cols[cls]
        r = row_of[state[np.maximum(group, 0)]]
        sel = (ccols >= 0) & (group >= 0) & (r >= 0)
        rows.add(first + r[sel], ccols[sel], sign)


def _memory_row(
    p: Problem, class_cols: dict[str, np.ndarray], fixed: dict[str, int], rows: _Rows
) -> str:
    """Σ (M[r,i] - min_i M[r,i]) s[r,i] <= budget - Σ min, in MiB; the message if it cannot hold."""
    if p.budget is None or not p.memory:
        return ""
    budget = p.budget
    most = 0.0
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for r, mem in p.memory.items():
        ok = np.isfinite(p.linear[r])
        low = float(mem[ok].min())  # a constant, since one strategy is chosen
        budget -= low
        most += float(mem[ok].max()) - low
        if r in fixed:
            continue
        sel = (class_cols[r] >= 0) & (mem != low)
        cols.append(class_cols[r][sel])
        vals.append((mem[sel] - low) / MEMORY_UNIT)
    if budget < 0:
        return "memory_budget: the smallest footprint of the allowed placements exceeds the budget"
    if most > budget:  # otherwise every choice fits and the row is not needed
        row = rows.new([-np.inf], [budget / MEMORY_UNIT])
        c = np.concatenate(cols)
        rows.add(np.full(len(c), row), c, np.concatenate(vals))
    return ""
