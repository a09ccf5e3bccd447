"""Near moves: the direct moves a large route network prices, enumerated state by state.

Stage 4, cost (called by :class:`~autoplan.cost.router.Router` for meshes of four axes or
more). Input: a tensor's per-axis placements (the options of
:func:`~autoplan.cost.routes.canonical_axes`), whose product is the network's states in
:func:`itertools.product` order. Output: the (source, target) state indices of every near
move.

Why: a network has (options per axis)^axes states, 1 296 to 2 401 on a 4-D mesh, and
pricing every pair of them was most of planning there. A route only needs the moves it
cannot make of cheaper ones, and a move that changes several axes in different ways runs
as one collective per change (DTensor's walk, axis by axis), so a chain of one-change
moves costs the same. Two kinds of multi-axis move are one collective and cheaper than
their parts, and are kept: one change made alike on several axes (``S(0)S(0) -> RR``,
one all-gather over the fused group) and a reduce-scatter of ``Partial`` axes into
shards of different dims (``PP -> S(0)S(1)``, one fused reduce-scatter). A move
also runs its local changes (``R -> S(d)`` or ``R -> P``, no bytes moved) first, on the
whole tensor, so one with a collective can cost less than its parts (``RRPP ->
RS(0)S(0)S(0)`` reduce-scatters the chunk; from ``RS(0)PP`` the nested shard takes an
all-reduce). The near moves, per state, are the changes of one collective:

- one axis changed to any of its other placements;
- one change ``x -> y`` made on two or more of the axes holding ``x``;
- two or more ``Partial`` axes each turned into a shard, of two or more distinct dims;

each with any local changes on the other replicated axes (local changes alone are made
of one-axis moves, free).

That these keep every route price of the full network is tested against it on 4-D
meshes (``tests/unit/cost/test_lazy_routes.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from autoplan.core.torch_adapter import Partial, Placement, Replicate, Shard

__all__ = ["near_pairs"]


def near_pairs(per_axis: Sequence[Sequence[Placement]]) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) indices of the near moves (module docstring) between the states
    ``itertools.product(*per_axis)``, each pair once."""
    sizes = [len(options) for options in per_axis]
    stride = [math.prod(sizes[a + 1 :]) for a in range(len(sizes))]
    option = np.indices(sizes).reshape(len(sizes), -1)  # option[a, state]
    index = [{p: i for i, p in enumerate(options)} for options in per_axis]
    replicated = [index[a].get(Replicate()) for a in range(len(sizes))]
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    for changes in _counted(per_axis, index):
        moved = {a for a, _, _ in changes}
        local = all(f == replicated[a] for a, f, _ in changes)
        at = np.ones(option.shape[1], dtype=bool)
        for a, f, _ in changes:
            at &= option[a] == f
        delta = sum((t - f) * stride[a] for a, f, t in changes)
        # with local changes (from R) on any of the other axes: they run first, on the
        # whole tensor, and may shrink what the change moves; per set of such axes, the
        # states R there and every choice of their targets at once
        others = [(a, r) for a, r in enumerate(replicated) if a not in moved and r is not None]
        for k in range(len(others) + 1):
            if k and local:
                break  # local changes alone: made of one-axis moves, free
            for chosen in itertools.combinations(others, k):
                where = at.copy()
                shifts = np.zeros(1, dtype=np.int64)
                for a, r in chosen:
                    where &= option[a] == r
                    steps = np.array([(t - r) * stride[a] for t in range(sizes[a]) if t != r])
                    shifts = (shifts[:, None] + steps[None, :]).ravel()
                found = np.flatnonzero(where)
                src.append(np.repeat(found, len(shifts)))
                dst.append((found[:, None] + (delta + shifts)[None, :]).ravel())
    if not src:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    n = option.shape[1]
    pairs = np.unique(np.concatenate(src).astype(np.int64) * n + np.concatenate(dst))
    return pairs // n, pairs % n


def _counted(
    per_axis: Sequence[Sequence[Placement]], index: list[dict[Placement, int]]
) -> list[list[tuple[int, int, int]]]:
    """The changes one collective makes, as (axis, option from, option to): one axis to
    any other placement; one change made alike on two or more axes; ``Partial`` axes
    turned into shards of two or more distinct dims."""
    axes = range(len(per_axis))
    out = [[(a, f, t)] for a in axes for f, t in itertools.permutations(range(len(per_axis[a])), 2)]
    placements = list(dict.fromkeys(p for options in per_axis for p in options))
    for x, y in itertools.permutations(placements, 2):
        holding = [a for a in axes if x in index[a] and y in index[a]]
        out += [[(a, index[a][x], index[a][y]) for a in g] for g in _groups(holding)]
    for p in (p for p in placements if isinstance(p, Partial)):
        for g in _groups([a for a in axes if p in index[a]]):
            shards = [[s for s in per_axis[a] if isinstance(s, Shard)] for a in g]
            for chosen in itertools.product(*shards):
                if len({s.dim for s in chosen}) >= 2:  # one dim: a change made alike
                    out.append(
                        [(a, index[a][p], index[a][s]) for a, s in zip(g, chosen, strict=True)]
                    )
    return out


def _groups(axes: Sequence[int]) -> list[tuple[int, ...]]:
    """The subsets of two or more of ``axes``."""
    return [g for k in range(2, len(axes) + 1) for g in itertools.combinations(axes, k)]
