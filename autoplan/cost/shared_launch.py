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
        return self._charged(where, e.tensor.dtype_bytes, redist, steps, {})

    def savings(self, e: EdgeCost, redist: RedistributeModel) -> np.ndarray:
        """Per cell of ``e.cost``, its price less its move's charge (:meth:`steps`): 0
        where no step is of an open kind, and for a move that cannot run."""
        out = np.zeros(e.cost.shape)
        where = self.where(e) if self.open else ""
        if not where or e.tensor is None:
            return out
        dtype_bytes = e.tensor.dtype_bytes
        # Per edge, a route's hops repeat over its cells and the same steps over its
        # hops: each is priced once.
        hops: dict[tuple[int, int], list[Step]] = {}
        charges: dict[Step, float] = {}
        for r, c in zip(*np.nonzero(np.isfinite(e.cost) & (e.cost > 0)), strict=True):
            steps = e.route_steps(redist, int(r), int(c), hops)
            charged = self._charged(where, dtype_bytes, redist, steps, charges)
            out[r, c] = sum(s[3] for s in steps) - sum(s[3] for s in charged)
        return out

    def _charged(
        self,
        where: str,
        dtype_bytes: int,
        redist: RedistributeModel,
        steps: list[Step],
        charges: dict[Step, float],
    ) -> list[Step]:
        """``steps`` as a move at ``where`` is charged (:meth:`steps`); ``charges``
        remembers each charged step's time for a caller pricing many moves alike."""
        out = []
        for hop, step in enumerate(steps):
            kind, axes, nbytes, us = step
            if (where == "tail" or hop == 0) and (where, kind, axes) in self.open:
                charged = charges.get(step)
                if charged is None:
                    charged = charges[step] = self._charge(where, dtype_bytes, redist, step)
                step = (kind, axes, nbytes, charged)
            out.append(step)
        return out

    def _charge(self, where: str, dtype_bytes: int, redist: RedistributeModel, step: Step) -> float:
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
