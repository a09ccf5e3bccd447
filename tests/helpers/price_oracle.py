"""``Oracle``: the per-pair redistribution walk on DTensor placement objects as autoplan had
it before codes and edge matrices (commit c0fe833), kept frozen so that a change to the
shared walk cannot hide from the edge-pricing tests; its one later addition,
``_strided_runs``, is written on placement objects too. ``check_pairs`` compares an edge's
matrix with the per-pair references."""

from __future__ import annotations

import math

from autoplan.core.placements import fmt, plain, shard_degrees, sharded_dim
from autoplan.core.topology import Topology, group_span
from autoplan.core.torch_adapter import Partial, Replicate, _StridedShard
from autoplan.cost.collectives import CollectiveModel


def _step(src, dst):
    if src == dst:
        return ""
    s_dim, d_dim = sharded_dim(src), sharded_dim(dst)
    strided = isinstance(src, _StridedShard) or isinstance(dst, _StridedShard)
    if isinstance(src, Partial):
        if isinstance(dst, Replicate):
            return "all_reduce"
        if d_dim is None:
            return None
        return "all_reduce" if strided else "reduce_scatter"  # DTensor's strided path
    if s_dim is not None:
        if isinstance(dst, Replicate):
            return "all_gather"
        if d_dim is not None:
            return "all_gather" if s_dim == d_dim or strided else "all_to_all"
        return None
    return ""


def _transforms(src, dst):
    current, steps = list(src), []
    if any(sharded_dim(p) is not None for p in src):
        for axis in reversed(range(len(src))):
            target, d = dst[axis], sharded_dim(dst[axis])
            if d is not None:
                have = [i for i in range(axis) if sharded_dim(current[i]) == d]
                want = [i for i in range(axis) if sharded_dim(dst[i]) == d]
                if have != want:
                    target = Replicate()
            if current[axis] != target:
                steps.append((axis, current[axis], target))
                current[axis] = target
    for axis, target in enumerate(dst):
        if current[axis] != target:
            steps.append((axis, current[axis], target))
            current[axis] = target
    return steps


def _strided_runs(src, dst) -> bool:
    """A move with a ``_StridedShard`` side changes one axis, and where a dim is sharded
    on several axes with a stride among them, only its last such axis, strided alone."""
    if not any(isinstance(p, _StridedShard) for p in (*src, *dst)):
        return True
    changed = {a for a, (p, q) in enumerate(zip(src, dst, strict=True)) if p != q}
    if len(changed) > 1:
        return False
    for side in (src, dst):
        by_dim: dict[int, list[int]] = {}
        for a, p in enumerate(side):
            if sharded_dim(p) is not None:
                by_dim.setdefault(sharded_dim(p), []).append(a)
        for axes in by_dim.values():
            strided = [a for a in axes if isinstance(side[a], _StridedShard)]
            if len(axes) > 1 and strided and (strided != [axes[-1]] or changed != {axes[-1]}):
                return False
    return True


def _fuse(steps, shape, mesh_shape):
    out, i = [], 0
    while i < len(steps):
        _, a, b = steps[i]
        kind, j = _step(a, b) or "", i + 1
        if kind in ("all_gather", "all_reduce", "reduce_scatter"):
            while j < len(steps) and steps[j][1:] == (a, b):
                j += 1
        run = steps[i:j]
        axes = [s[0] for s in run]
        order = axes if kind == "all_reduce" else sorted(axes, reverse=kind == "all_gather")
        contiguous = sorted(axes) == list(range(min(axes), max(axes) + 1))
        even = kind != "reduce_scatter" or (
            shape[sharded_dim(b)] % math.prod(mesh_shape[x] for x in axes) == 0
        )
        if len(run) > 1 and axes == order and contiguous and even:
            out.append((kind, tuple(sorted(axes)), b))
        else:
            out.extend((_step(x, y) or "", (ax,), y) for ax, x, y in run)
        i = j
    return out


class Oracle:
    """The pre-EdgePricer per-pair price: walk and sum on placement objects (an _S(d,1)
    read as the S(d) it is)."""

    def __init__(self, mesh_shape):
        self.mesh_shape = tuple(mesh_shape)
        self.collectives = CollectiveModel(Topology())

    def cost_us(self, src, dst, shape, dtype_bytes) -> float:
        src, dst = plain(src), plain(dst)
        if src == dst:
            return 0.0
        if not _strided_runs(src, dst):
            return math.inf
        if any(_step(s, d) is None for s, d in zip(src, dst, strict=True)):
            return math.inf
        current, mesh = list(src), self.mesh_shape
        numel = math.prod(shape) * dtype_bytes
        times = []
        for kind, axes, target in _fuse(_transforms(src, dst), shape, mesh):
            local = numel / math.prod(shard_degrees(current, mesh, len(shape)))
            gathered = [Replicate() if a in axes else p for a, p in enumerate(current)]
            for a in axes:
                current[a] = target
            if not kind:
                continue
            nbytes = (
                numel / math.prod(shard_degrees(gathered, mesh, len(shape)))
                if kind == "all_gather"
                else local
            )
            p, m = group_span(mesh, axes, self.collectives.topology.gpus_per_node)
            times.append(self.collectives.time_us(kind, nbytes, p, m))
        return sum(times)


def check_pairs(fast, rows, cols, shape, dtype_bytes, refs, pairs, what) -> None:
    for r, c in pairs:
        for ref in refs:
            want = ref.cost_us(rows[r], cols[c], shape, dtype_bytes)
            # Bitwise, inf where inf: the sums run step after step in cost_us's order.
            assert fast[r, c] == want, f"{what}: {fmt(rows[r])} -> {fmt(cols[c])}"
