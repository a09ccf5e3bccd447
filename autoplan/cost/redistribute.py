"""Redistribution cost: the collectives that move a tensor between two placements.

Input: source and target placements (one per mesh axis), the tensor's global
shape and dtype, the mesh shape and a :class:`CollectiveModel`. Output:
microseconds, or ``inf`` when DTensor cannot make the move (then the ILP has
no variable for it at all).

Per mesh axis, DTensor's redistribute runs:

=================  ==============================  bytes priced
src -> dst          collective on that axis         (nccl-tests convention)
=================  ==============================  ======================
S(d) -> R           all-gather                      gathered local size
P -> R              all-reduce                      local size
P -> S(d)           reduce-scatter                  local size before
S(i) -> S(j)        all-to-all                      local size
R -> S(d), R -> P   local slice / zero, no comm     0
S -> P              not supported                   inf
=================  ==============================

``_StridedShard`` moves like ``Shard`` (it is one with a different order).
Axes are visited innermost first for gathers and reductions, as DTensor's
default order does, and the local size is updated after each step, so a
gather on an inner axis is priced on the already-gathered outer size. Where
consecutive axes run the same gather or reduction with nothing in between
(e.g. ``S(0)S(0) -> RR``, ``PP -> RR``), the steps are priced as one
collective over the flattened group, as DTensor runs them when the flattened
mesh exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.topology import group_span
from autoplan.placements import Placements, sharded_dim
from autoplan.strategies.dtensor import Partial, Placement, Replicate

INF = math.inf


def _is_partial(p: Placement) -> bool:
    return isinstance(p, Partial)


def _step(src: Placement, dst: Placement) -> str | None:
    """The collective one axis needs, ``""`` for a free local step, None if impossible."""
    if src == dst:
        return ""
    s_dim, d_dim = sharded_dim(src), sharded_dim(dst)
    if _is_partial(src):
        if isinstance(dst, Replicate):
            return "all_reduce"
        if d_dim is not None:
            return "reduce_scatter"
        return None  # one partial kind to another
    if s_dim is not None:
        if isinstance(dst, Replicate):
            return "all_gather"
        if d_dim is not None:
            return "all_gather" if s_dim == d_dim else "all_to_all"
        return None  # S -> P
    # src is Replicate
    return ""


class RedistributeModel:
    """Prices placement changes on one mesh; caches by (src, dst, shape, dtype)."""

    def __init__(self, mesh_shape: Sequence[int], collectives: CollectiveModel) -> None:
        self.mesh_shape = tuple(mesh_shape)
        self.collectives = collectives
        self.gpus_per_node = collectives.topology.gpus_per_node
        self._cache: dict[tuple[Placements, Placements, tuple[int, ...], int], float] = {}
        self._spans: dict[tuple[int, ...], tuple[int, int]] = {}

    def _span(self, axes: tuple[int, ...]) -> tuple[int, int]:
        span = self._spans.get(axes)
        if span is None:
            span = self._spans[axes] = group_span(self.mesh_shape, axes, self.gpus_per_node)
        return span

    def cost_us(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> float:
        if src == dst:
            return 0.0
        key = (src, dst, shape, dtype_bytes)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._price(src, dst, shape, dtype_bytes)
        return cached

    def steps(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> list[tuple[str, tuple[int, ...], float, float]] | None:
        """The priced collectives ``[(kind, axes, bytes, us), ...]``, None if impossible."""
        kinds = [_step(s, d) for s, d in zip(src, dst, strict=True)]
        if any(k is None for k in kinds):
            return None
        degrees = [1] * len(shape)
        for p, size in zip(src, self.mesh_shape, strict=True):
            d = sharded_dim(p)
            if d is not None:
                degrees[d] *= size
        local = math.prod(s // k for s, k in zip(shape, degrees, strict=True)) * dtype_bytes
        out: list[tuple[str, tuple[int, ...], float, float]] = []
        # Innermost axis first; fuse runs of the same collective on adjacent axes.
        axis = len(src) - 1
        while axis >= 0:
            kind = kinds[axis]
            if not kind:
                axis -= 1
                continue
            group = [axis]
            while (
                kind in ("all_gather", "all_reduce")
                and group[-1] - 1 >= 0
                and kinds[group[-1] - 1] == kind
                and (
                    kind == "all_reduce"
                    or sharded_dim(src[group[-1] - 1]) == sharded_dim(src[axis])
                )
            ):
                group.append(group[-1] - 1)
            axes = tuple(sorted(group))
            factor = math.prod(self.mesh_shape[a] for a in axes)
            if kind == "all_gather":
                local *= factor
                nbytes = local
            else:
                nbytes = local
                if kind == "reduce_scatter":
                    local //= factor
            p, m = self._span(axes)
            out.append((kind, axes, float(nbytes), self.collectives.time_us(kind, nbytes, p, m)))
            axis = group[-1] - 1
        return out

    def _price(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> float:
        steps = self.steps(src, dst, shape, dtype_bytes)
        if steps is None:
            return INF
        return sum(s[3] for s in steps)
