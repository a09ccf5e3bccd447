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

``_StridedShard`` moves like ``Shard`` (it is one with a different order), except
where DTensor's strided path differs: an axis going between a shard and an
``_StridedShard`` of another dim is gathered and cut locally (an all-gather of the
gathered size, not an all-to-all), and ``P`` to ``_StridedShard`` is an all-reduce.
That path is exact only for some moves (:func:`_strided_ok`: one axis changing, and in
a layout sharding a dim on several axes with a stride, only the strided last one); the
others are impossible here and routes make them one axis at a time
(``scripts/strided_moves.py`` runs them all). ``_S(d,1)`` *is* ``S(d)`` (no
interleaving), and moving between the two spellings is free: the executor relabels the
local shard.
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

from autoplan.core.placements import Placements, is_strided, plain, sharded_dim
from autoplan.core.topology import group_span
from autoplan.core.torch_adapter import Partial, Placement, Replicate
from autoplan.cost.collectives import CollectiveModel

INF = math.inf


# The walk below sees each axis placement as a *code* ``(kind, label)``: kind is the
# tensor dim it shards (Shard and _StridedShard alike), or R_KIND, P_KIND (any Partial)
# or OTHER_KIND; label tells apart unequal placements of one kind (``S(0)`` and
# ``_S(0,2)``, ``P`` and ``P(avg)``) and is 0 for R. That is all DTensor's order depends
# on, so one walk serves every move of the same form, and comparing int pairs is much
# cheaper than comparing DTensor placements. :func:`encode` makes the codes of one move.
Code = tuple[int, int]
R_KIND, P_KIND, OTHER_KIND = -1, -2, -3
R_CODE: Code = (R_KIND, 0)


def axis_kind(p: Placement) -> int:
    """The tensor dim ``p`` shards, or ``R_KIND`` (-1), ``P_KIND`` (-2), ``OTHER_KIND`` (-3)."""
    d = sharded_dim(p)
    if d is not None:
        return d
    return R_KIND if isinstance(p, Replicate) else P_KIND if isinstance(p, Partial) else OTHER_KIND


def encode(src: Placements, dst: Placements) -> tuple[tuple[Code, ...], tuple[Code, ...]]:
    """The codes of one move: equal placements get equal codes, unequal ones unequal
    (``_S(d,1)`` counts as ``S(d)``, the same layout: :func:`autoplan.core.placements.plain`)."""
    seen: list[Placement] = []
    codes: list[Code] = []
    for p in (*plain(src), *plain(dst)):
        k = axis_kind(p)
        if k == R_KIND:
            codes.append(R_CODE)
            continue
        label = next((i for i, q in enumerate(seen) if q == p), len(seen)) + 1
        if label > len(seen):
            seen.append(p)
        codes.append((k, -label if is_strided(p) else label))
    return tuple(codes[: len(src)]), tuple(codes[len(src) :])


def _step(src: Code, dst: Code) -> str | None:
    """The collective one axis needs, ``""`` for a free local step, None if impossible.

    A ``_StridedShard`` (negative label) on either side takes DTensor's strided path,
    which gathers the axis and cuts the target locally: an all-gather where two plain
    shards of different dims would swap by all-to-all, and an all-reduce where a partial
    would be reduce-scattered (``scripts/strided_moves.py``)."""
    if src == dst:
        return ""
    s, d = src[0], dst[0]
    strided = src[1] < 0 or dst[1] < 0
    if s == P_KIND:
        if d == R_KIND:
            return "all_reduce"
        if d >= 0:
            return "all_reduce" if strided else "reduce_scatter"
        return None  # one partial kind to another
    if s >= 0:
        if d == R_KIND:
            return "all_gather"
        if d >= 0:
            return "all_gather" if s == d or strided else "all_to_all"
        return None  # S -> P
    # src is Replicate (or of another kind): a local slice or zeroing
    return ""


Step = tuple[str, tuple[int, ...], float, float]  # (collective, mesh axes, bytes, us)


class RedistributeModel:
    """Prices placement changes on one mesh; caches by (src, dst, shape, dtype)."""

    def __init__(self, mesh_shape: Sequence[int], collectives: CollectiveModel) -> None:
        self.mesh_shape = tuple(mesh_shape)
        self.collectives = collectives
        self.gpus_per_node = collectives.topology.gpus_per_node
        self._cache: dict[tuple[Placements, Placements, tuple[int, ...], int], float] = {}
        self._steps: dict[
            tuple[Placements, Placements, tuple[int, ...], int], list[Step] | None
        ] = {}
        self._spans: dict[tuple[int, ...], tuple[int, int]] = {}
        # The steps found by the placements' identity first: hashing a placement tuple
        # runs DTensor's __hash__ in Python, and callers ask again with one object. An
        # entry holds its placements, so their ids stay theirs while it is kept.
        self._steps_by_id: dict[
            tuple[int, int, tuple[int, ...], int], tuple[Placements, Placements, list[Step] | None]
        ] = {}

    def span(self, axes: tuple[int, ...]) -> tuple[int, int]:
        """(ranks per node, nodes) of the process group over mesh ``axes``."""
        span = self._spans.get(axes)
        if span is None:
            span = self._spans[axes] = group_span(self.mesh_shape, axes, self.gpus_per_node)
        return span

    def cost_us(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> float:
        if src == dst:  # two spellings of one layout come out free through encode
            return 0.0
        key = (src, dst, shape, dtype_bytes)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._price(src, dst, shape, dtype_bytes)
        return cached

    def steps(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> list[Step] | None:
        """The priced collectives ``[(kind, axes, bytes, us), ...]``, None if impossible;
        remembered per move (the list is shared: read it, do not change it)."""
        fast = (id(src), id(dst), shape, dtype_bytes)
        hit = self._steps_by_id.get(fast)
        if hit is not None and hit[0] is src and hit[1] is dst:
            return hit[2]
        key = (src, dst, shape, dtype_bytes)
        if key in self._steps:
            self._steps_by_id[fast] = (src, dst, self._steps[key])
            return self._steps[key]
        found = moves(*encode(src, dst), shape, self.mesh_shape)
        out: list[Step] | None = None
        if found is not None:
            numel = math.prod(shape) * dtype_bytes
            out = []
            for kind, axes, divisor in found:
                nbytes = numel / divisor
                p, m = self.span(axes)
                out.append(
                    (kind, axes, float(nbytes), self.collectives.time_us(kind, nbytes, p, m))
                )
        self._steps[key] = out
        self._steps_by_id[fast] = (src, dst, out)
        return out

    def _price(
        self, src: Placements, dst: Placements, shape: tuple[int, ...], dtype_bytes: int
    ) -> float:
        steps = self.steps(src, dst, shape, dtype_bytes)
        if steps is None:
            return INF
        return sum(s[3] for s in steps)


def moves(
    src: tuple[Code, ...],
    dst: tuple[Code, ...],
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
) -> list[tuple[str, tuple[int, ...], int]] | None:
    """The collectives of one move (as :func:`encode` codes) without bytes:
    ``[(kind, axes, divisor), ...]``.

    Each collective moves ``numel x dtype_bytes / divisor`` bytes: the local size before
    the step, or after it for a gather (the gathered size). The divisor is the product of
    the mesh axes that shard the tensor at that point, so the list depends on the shape
    only through its rank and through which dims divide evenly by which flattened groups
    (``_fuse``); :mod:`autoplan.cost.edge_prices` relies on that to reuse it across shapes.
    None if DTensor cannot make the move.
    """
    if not _strided_ok(src, dst) or any(_step(s, d) is None for s, d in zip(src, dst, strict=True)):
        return None
    current = list(src)
    out: list[tuple[str, tuple[int, ...], int]] = []
    for kind, axes, target in _fuse(_transforms(src, dst), shape, mesh_shape):
        if kind == "all_gather":  # moves the gathered size, also when a local cut follows
            for a in axes:
                current[a] = R_CODE
            out.append((kind, axes, _divisor(current, mesh_shape)))
        elif kind:  # moves the local size before the step
            out.append((kind, axes, _divisor(current, mesh_shape)))
        for a in axes:
            current[a] = target
    return out


def _strided_ok(src: tuple[Code, ...], dst: tuple[Code, ...]) -> bool:
    """Whether a move with a ``_StridedShard`` side is one DTensor runs as priced.

    torch's strided path is exact only for a change of one mesh axis, and, where a dim is
    sharded on several axes with a ``_StridedShard`` among them ("nested"), only when
    the stride sits on the last of those axes alone and that axis is the one changing
    (``S(0)_S(0,k) <-> S(0)R``, ``S(0)S(1)``, ...). Its other strided moves give other
    shards, raise, or run other collectives (``scripts/strided_moves.py``); they are
    impossible here, and routes reach the same targets one axis at a time through plain
    placements (:mod:`autoplan.cost.routes`).
    """
    if all(c[1] >= 0 for c in (*src, *dst)):
        return True
    changed = [a for a, (s, d) in enumerate(zip(src, dst, strict=True)) if s != d]
    if len(changed) != 1:
        return not changed  # staying put is free whatever the layout
    for side in (src, dst):
        for dim in {c[0] for c in side if c[0] >= 0}:
            axes = [a for a, c in enumerate(side) if c[0] == dim]
            if len(axes) < 2 or all(side[a][1] >= 0 for a in axes):
                continue
            if changed != [axes[-1]] or any(side[a][1] < 0 for a in axes[:-1]):
                return False
    return True


def _divisor(codes: Sequence[Code], mesh_shape: tuple[int, ...]) -> int:
    """How many pieces the tensor is cut into: the product of the axes that shard it."""
    return math.prod(size for c, size in zip(codes, mesh_shape, strict=True) if c[0] >= 0)


def _transforms(src: tuple[Code, ...], dst: tuple[Code, ...]) -> list[tuple[int, Code, Code]]:
    """The per-axis steps ``(axis, from, to)`` DTensor's redistribute takes, in order.

    DTensor (default shard order) first walks the axes innermost to outermost. A shard of
    tensor dim d on axis a is the same local piece in source and target only when the
    outer axes shard d the same way in both; where they do not ("nested" sharding, e.g.
    ``RS(0) -> S(0)S(0)``, whose local pieces differ), the axis is gathered to ``R``
    first. It then walks outermost to innermost to reach the target. So ``RS(0) ->
    S(0)S(0)`` costs an all-gather, not a local slice.
    """
    current = list(src)
    steps: list[tuple[int, Code, Code]] = []
    if any(c[0] >= 0 for c in src):
        for axis in reversed(range(len(src))):
            target = dst[axis]
            d = target[0]
            if d >= 0:
                have = [i for i in range(axis) if current[i][0] == d]
                want = [i for i in range(axis) if dst[i][0] == d]
                if have != want:
                    target = R_CODE
            if current[axis] != target:
                steps.append((axis, current[axis], target))
                current[axis] = target
    for axis, target in enumerate(dst):
        if current[axis] != target:
            steps.append((axis, current[axis], target))
            current[axis] = target
    return steps


def _fuse(
    steps: list[tuple[int, Code, Code]],
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
) -> list[tuple[str, tuple[int, ...], Code]]:
    """Group consecutive identical collectives on adjacent axes into one flattened one.

    DTensor merges a run of consecutive steps with the same (from, to) pair into one
    collective over the flattened mesh of their axes, if that mesh exists (``apply``
    creates one for every run of adjacent axes): gathers must come innermost first,
    reduce-scatters outermost first (all-reduces in any order) and divide the tensor dim evenly. A run that cannot
    merge as a whole stays step by step. Output: ``(kind, axes, target)``, kind ``""``
    for a local step.
    """
    out: list[tuple[str, tuple[int, ...], Code]] = []
    i = 0
    while i < len(steps):
        axis, a, b = steps[i]
        kind = _step(a, b) or ""
        j = i + 1
        if kind in ("all_gather", "all_reduce", "reduce_scatter"):
            while j < len(steps) and steps[j][1:] == (a, b):
                j += 1
        if j == i + 1:  # a lone step: nothing to merge
            out.append((kind, (axis,), b))
            i = j
            continue
        run = steps[i:j]
        axes = [s[0] for s in run]
        order = axes if kind == "all_reduce" else sorted(axes, reverse=kind == "all_gather")
        contiguous = sorted(axes) == list(range(min(axes), max(axes) + 1))
        even = kind != "reduce_scatter" or (
            shape[b[0]] % math.prod(mesh_shape[x] for x in axes) == 0
        )
        if axes == order and contiguous and even:
            out.append((kind, tuple(sorted(axes)), b))
        else:
            out.extend((_step(x, y) or "", (ax,), y) for ax, x, y in run)
        i = j
    return out
