"""Stage 4 (cost), shared launches: moves priced as members of a bucket of their kind.

Input: a :class:`~autoplan.cost.price.CostTable`, the traced graph, the bucket cap and
a set of *open* bucket kinds ``(where, collective, mesh axes)``. Output: a cost table
in which each move of an open kind pays its bandwidth, its part of the bucket's copies
(with a compute model) and a share of one launch in proportion to the bytes it fills
(:func:`open_costs`), and the same charge per move (:meth:`SharedLaunch.steps`) for the
plan's read-out and its buckets.

Why: the ILP sums one price per move, but a step runs the head gathers and the tail
reductions of one kind merged, one launch per bucket (:mod:`autoplan.cost.buckets`).
Priced one launch per move, a layout of many small moves (data parallelism of a model
with many parameters) looks far dearer than it runs. A share is what a member of a
full bucket pays, but a kind with a single member pays its whole launch when run, so
a kind is opened only where a plan already merges it
(:mod:`autoplan.planner.bucket_search`), and every plan is judged by its estimate with
the buckets it runs (:attr:`~autoplan.result.plan.Plan.estimated_step_us`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from autoplan.core.placements import Placements
from autoplan.cost.buckets import (
    GRAD_SLOT,
    Step,
    grad_tail,
    member_bytes,
    member_copies_us,
    param_derived,
)
from autoplan.cost.compute import ComputeModel
from autoplan.cost.price import TANGENT_SLOT, CostTable, EdgeCost
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.routes import Routes
from autoplan.trace.capture import TracedGraph

__all__ = ["BucketKind", "SharedLaunch", "open_costs"]

BucketKind = tuple[str, str, tuple[int, ...]]  # "head" or "tail", collective, mesh axes


@dataclass(frozen=True)
class SharedLaunch:
    """Which moves share their bucket's launch, and what each is charged.

    ``open`` holds the kinds whose moves are charged a share; ``head`` the nodes
    computed from parameters alone (a move out of one is a head gather), ``tail`` the
    reshaping nodes through which alone a value reaches the gradients (a move into one
    is a tail reduction, as a gradient's move to its parameter is); ``fill`` the bytes
    of one bucket of each place at most (the cap, or all of that place's tensors when
    they fill less); ``compute`` prices each move's part of its bucket's copies
    (:func:`~autoplan.cost.buckets.member_copies_us`), which it is charged too."""

    open: frozenset[BucketKind]
    head: frozenset[str]
    tail: frozenset[str]
    fill: dict[str, float]
    compute: ComputeModel

    @staticmethod
    def of(
        traced: TracedGraph,
        costs: CostTable,
        open_: Iterable[BucketKind],
        cap_bytes: float,
        compute: ComputeModel,
    ) -> SharedLaunch:
        grads = head = 0.0
        for e in costs.edges:
            if e.slot == GRAD_SLOT and e.tensor is not None:
                grads += math.prod(e.tensor.shape) * e.tensor.dtype_bytes
        for name in traced.params:
            value = traced.node(name).meta["val"]
            head += value.numel() * value.element_size()
        fill = {
            "tail": min(cap_bytes, grads or cap_bytes),
            "head": min(cap_bytes, head or cap_bytes),
        }
        return SharedLaunch(
            open=frozenset(open_),
            head=frozenset(param_derived(traced, set())),
            tail=frozenset(grad_tail(traced)),
            fill=fill,
            compute=compute,
        )

    def where(self, e: EdgeCost) -> str:
        """``"tail"``, ``"head"`` or ``""``: where ``e``'s moves would run merged."""
        if e.slot == GRAD_SLOT or e.dst in self.tail:
            return "tail"
        if e.slot != TANGENT_SLOT and e.src in self.head:
            return "head"
        return ""

    def steps(self, e: EdgeCost, redist: RedistributeModel, row: int, col: int) -> list[Step]:
        """The move's steps as charged: a head move's first collective or any of a tail
        move's, of an open kind, less the part of its launch the bucket's others pay."""
        steps = e.route_steps(redist, row, col)
        where = self.where(e) if self.open else ""
        if not where or e.tensor is None:
            return steps
        walk = _Walk(self, where, e.tensor.shape, e.tensor.dtype_bytes, redist)
        return walk.charged_steps(steps)

    def savings(self, e: EdgeCost, redist: RedistributeModel) -> np.ndarray:
        """Per cell of ``e.cost``, its price less its move's charge (:meth:`steps`): 0
        where no step is of an open kind, and for a move that cannot run."""
        out = np.zeros(e.cost.shape)
        where = self.where(e) if self.open else ""
        if not where or e.tensor is None:
            return out
        prices = np.asarray(e.cost)
        cells = np.isfinite(prices) & (prices > 0)
        walk = _Walk(self, where, e.tensor.shape, e.tensor.dtype_bytes, redist)
        net, row_state, col_state = e.net, e.row_state, e.col_state
        if net is None or row_state is None or col_state is None:
            for r, c in zip(*np.nonzero(cells), strict=True):
                out[r, c] = walk.saving(e.src_placements[r], e.dst_placements[c])
            return out
        # A cell's route is the path to its column's state in the tree of routes out of
        # its row's state: the sums along a tree are shared by the routes through it.
        sources = np.unique(row_state[cells.any(axis=1)])
        if not len(sources):
            return out
        for part in np.array_split(sources, -(-len(sources) // _SOURCES_AT_ONCE)):
            saved = walk.trees(net, part)
            rows = np.flatnonzero(np.isin(row_state, part))
            out[rows] = saved[np.ix_(np.searchsorted(part, row_state[rows]), col_state)]
        return np.where(cells, out, 0.0)

    def shares(self, where: str, kind: str, axes: tuple[int, ...], *, first: bool) -> bool:
        """Whether a move at ``where`` shares a launch for this step of ``kind`` over
        ``axes`` (``first``: its first collective): a head move's first step or any step of
        a tail move, of an open kind."""
        return (where == "tail" or first) and (where, kind, axes) in self.open

    def charge(self, where: str, dtype_bytes: int, redist: RedistributeModel, step: Step) -> float:
        """One step's time as a member of its bucket at ``where``: less the share of its
        launch the others pay, plus its part of the bucket's copies."""
        kind, axes, nbytes, us = step
        p, m = redist.span(axes)
        # the launch: the time of the smallest message the group can move
        launch = min(us, redist.collectives.time_us(kind, dtype_bytes * p * m, p, m))
        share = min(1.0, nbytes / self.fill[where])
        us -= (1.0 - share) * launch
        in_bytes, out_bytes = member_bytes(kind, nbytes, p * m)
        return us + member_copies_us(where, kind, in_bytes, out_bytes, self.compute, share)


def open_costs(costs: CostTable, launch: SharedLaunch, redist: RedistributeModel) -> CostTable:
    """``costs`` with each move of ``launch``'s open kinds charged as
    :meth:`SharedLaunch.steps` charges it; the others (and the table) unchanged."""
    if not launch.open:
        return costs
    places = {where for where, _, _ in launch.open}
    done: dict[tuple[int, str], np.ndarray] = {}  # twins share their price matrix
    edges = []
    for e in costs.edges:
        where = launch.where(e)
        if where not in places or e.tensor is None:
            edges.append(e)
            continue
        key = (id(e.cost), where)
        cost = done.get(key)
        if cost is None:
            cost = done[key] = e.cost - launch.savings(e, redist)
        edges.append(replace(e, cost=cost))
    return replace(costs, edges=tuple(edges))


# Sources whose trees of routes are summed together: their arrays are sources x states.
_SOURCES_AT_ONCE = 256


class _Walk:
    """Charges the steps of the moves of one tensor at one place (:meth:`charged`, the
    rule of :meth:`SharedLaunch.shares`, each distinct step's charge found once) and sums
    what a move, or each route of a tree, saves."""

    def __init__(
        self,
        launch: SharedLaunch,
        where: str,
        shape: tuple[int, ...],
        dtype_bytes: int,
        redist: RedistributeModel,
    ) -> None:
        self.launch, self.where, self.redist = launch, where, redist
        self.shape, self.dtype_bytes = shape, dtype_bytes
        self.charges: dict[Step, float] = {}

    def steps(self, a: Placements, b: Placements) -> list[Step]:
        """The steps of the move from ``a`` to ``b`` (none for one that cannot run)."""
        return self.redist.steps(a, b, self.shape, self.dtype_bytes) or []

    def charged(self, step: Step, *, first: bool) -> float:
        """``step``'s time as a move is charged for it (``first``: the move's first)."""
        kind, axes, _, time = step
        if not self.launch.shares(self.where, kind, axes, first=first):
            return time
        found = self.charges.get(step)
        if found is None:
            found = self.charges[step] = self.launch.charge(
                self.where, self.dtype_bytes, self.redist, step
            )
        return found

    def charged_steps(self, steps: list[Step]) -> list[Step]:
        """A move's ``steps``, each with its time as charged."""
        out = []
        for i, step in enumerate(steps):
            kind, axes, nbytes, _ = step
            out.append((kind, axes, nbytes, self.charged(step, first=i == 0)))
        return out

    def saving(self, a: Placements, b: Placements) -> float:
        """What the move from ``a`` to ``b`` saves: its steps' times less their charges."""
        steps = self.steps(a, b)
        return sum(s[3] for s in steps) - sum(s[3] for s in self.charged_steps(steps))

    def trees(self, net: Routes, sources: np.ndarray) -> np.ndarray:
        """Per source state and state, the saving of the route between them (0 where none
        reaches): the steps and their charges (:meth:`charged`) summed down each source's
        tree of routes, a level at a time, each hop's steps in their order (the sums of the
        route's steps and charges taken one by one, to the bit)."""
        parent = np.stack([net.tree(int(s)) for s in sources])
        rows = np.arange(len(sources))[:, None]
        below = (parent >= 0) & (parent != np.arange(net.size))  # in a tree, not its root
        depth = np.zeros(parent.shape, dtype=np.int64)
        up, climbing = np.broadcast_to(np.arange(net.size), parent.shape).copy(), below
        while climbing.any():
            depth += climbing
            up = np.where(climbing, parent[rows, np.maximum(up, 0)], up)
            climbing = climbing & (up != sources[:, None])
        time, first, later, count, back = self._hops(net, parent[below], np.nonzero(below)[1])
        hop = np.zeros(parent.shape, dtype=np.int64)  # per tree edge, its pair of states
        hop[below] = back
        us, charged = np.zeros(parent.shape), np.zeros(parent.shape)
        stepped = np.zeros(parent.shape, dtype=bool)
        for level in range(1, int(depth.max()) + 1):
            r, v = np.nonzero(depth == level)
            u, h = parent[r, v], hop[r, v]
            a, c, done = us[r, u], charged[r, u], stepped[r, u]
            for k in range(time.shape[0]):
                has = count[h] > k
                a = np.where(has, a + time[k, h], a)
                paid = np.where(done, later[k, h], first[k, h])
                c = np.where(has, c + paid, c)
                done = done | has
            us[r, v], charged[r, v], stepped[r, v] = a, c, done
        return us - charged

    def _hops(
        self, net: Routes, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The steps of the distinct hops among ``src -> dst`` (states of ``net``), as
        (step, hop) arrays of their times and charges, as a route's first step or a later
        one, each hop's number of steps, and which distinct hop each ``src -> dst`` is."""
        pairs, back = np.unique(src * net.size + dst, return_inverse=True)
        found = []
        for pair in pairs.tolist():
            found.append(self.steps(net.states[pair // net.size], net.states[pair % net.size]))
        width = max((len(f) for f in found), default=0)
        time, first, later = np.zeros((3, width, len(pairs)))
        for i, steps in enumerate(found):
            for k, step in enumerate(steps):
                time[k, i] = step[3]
                first[k, i] = self.charged(step, first=k == 0)
                later[k, i] = self.charged(step, first=False)
        count = np.array([len(f) for f in found], dtype=np.int64)
        return time, first, later, count, back
