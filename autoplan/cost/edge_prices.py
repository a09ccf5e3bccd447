"""Redistribution prices of whole edges: one matrix per producer->consumer tensor.

Stage 4, cost (called by :mod:`autoplan.cost.price`). Input: an edge's distinct
source placements (rows), distinct target placements (columns), the tensor's
shape and element size. Output: the rows x columns matrix of microseconds, equal
bit for bit to :meth:`RedistributeModel.cost_us` pair by pair (``inf`` where the
move is impossible).

Why: priced pair by pair, a 2-layer LLaMA on an 8x8 mesh asks about 10^5 pairs,
each walking DTensor's step order and the collective model in Python. But which
collectives a move runs, on which axis groups and on what fraction of the
tensor (:func:`~autoplan.cost.redistribute.moves`) depends on the shape only
through its rank and through which dims divide evenly by which flattened axis
groups. So each (source, target, divisibility) pair is walked once per planning
run, an edge's pairs become integer arrays of *terms* (collective, axes,
divisor) once per (rows, columns, divisibility), and a matrix costs one
``time_us`` per distinct term and bytes plus a few numpy gathers. The per-step
sums run in the same order as ``cost_us``'s, so the floats are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost.redistribute import RedistributeModel, moves
from autoplan.placements import Placements, sharded_dim
from autoplan.strategies.dtensor import Partial, Placement, Replicate

# (kind, axes, divisor): one collective moving numel x dtype_bytes / divisor bytes.
Term = tuple[str, tuple[int, ...], int]
# Per tensor dim, whether it divides by each flattened group of two or more adjacent axes.
Divisibility = tuple[tuple[bool, ...], ...]


@dataclass(frozen=True, slots=True)
class _Layout:
    """The terms of every (row, column) pair of one edge, without bytes.

    ``slots[k, r, c]`` indexes ``terms`` for the k-th collective of pair (r, c), or
    ``len(terms)`` (a zero-time pad) when the pair has fewer collectives.
    """

    terms: tuple[int, ...]  # ids into EdgePricer's term list
    slots: np.ndarray  # (steps, rows, cols) int
    impossible: np.ndarray  # (rows, cols) bool


_UNSEEN: Any = object()


def _kind(p: Placement) -> int:
    """What the walk asks of one axis placement: the dim it shards, or R -1, P -2, other -3."""
    d = sharded_dim(p)
    if d is not None:
        return d
    return -1 if isinstance(p, Replicate) else -2 if isinstance(p, Partial) else -3


class EdgePricer:
    """Prices edge matrices on one mesh; owns its caches for one planning run."""

    def __init__(self, redist: RedistributeModel) -> None:
        self.redist = redist
        mesh = redist.mesh_shape
        # Flattened groups _fuse may merge a reduce-scatter over: runs of adjacent axes.
        self._groups = [
            math.prod(mesh[i:j]) for i in range(len(mesh)) for j in range(i + 2, len(mesh) + 1)
        ]
        # Placement tuples, and the placements of single axes, interned to small ints.
        self._ids: dict[Placements, int] = {}
        self._placements: list[Placements] = []
        self._axis_ids: dict[Placement, int] = {}
        self._axes: list[tuple[int, ...]] = []  # per placement tuple: its axis ids
        self._kinds: list[tuple[int, ...]] = []  # per placement tuple: _kind of each axis
        self._reduces: list[bool] = []  # may run a fused reduce-scatter (2+ Partial axes)
        self._term_ids: dict[Term, int] = {}
        self._terms: list[Term] = []
        self._pairs: dict[tuple[int, int, Divisibility | None], tuple[int, ...] | None] = {}
        self._forms: dict[tuple[Any, ...], tuple[int, ...] | None] = {}
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...], Divisibility], _Layout] = {}
        self._times: dict[tuple[int, int], float] = {}

    def matrix(
        self,
        rows: Sequence[Placements],
        cols: Sequence[Placements],
        shape: tuple[int, ...],
        dtype_bytes: int,
    ) -> np.ndarray:
        """``cost[r, c] = redist.cost_us(rows[r], cols[c], shape, dtype_bytes)``, all at once."""
        divisible = tuple(tuple(n % g == 0 for g in self._groups) for n in shape)
        key = (self._intern(rows), self._intern(cols), divisible)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._layout(key[0], key[1], divisible, shape)
        numel = math.prod(shape) * dtype_bytes
        times = np.zeros(len(layout.terms) + 1)  # the last entry is the pad
        for k, term in enumerate(layout.terms):
            times[k] = self._time(term, numel)
        if len(layout.slots):
            cost = times[layout.slots[0]]
            for slot in layout.slots[1:]:
                cost += times[slot]  # step after step, as cost_us sums them
        else:
            cost = np.zeros(layout.impossible.shape)
        cost[layout.impossible] = math.inf
        return cost

    def _intern(self, placements: Sequence[Placements]) -> tuple[int, ...]:
        # Hash each placement tuple once per edge; the caches below key on small ints.
        out = []
        for p in placements:
            i = self._ids.get(p)
            if i is None:
                i = self._ids[p] = len(self._placements)
                self._placements.append(p)
                self._axes.append(
                    tuple(self._axis_ids.setdefault(x, len(self._axis_ids)) for x in p)
                )
                self._kinds.append(tuple(_kind(x) for x in p))
                self._reduces.append(sum(isinstance(x, Partial) for x in p) >= 2)
            out.append(i)
        return tuple(out)

    def _layout(
        self,
        rows: tuple[int, ...],
        cols: tuple[int, ...],
        divisible: Divisibility,
        shape: tuple[int, ...],
    ) -> _Layout:
        pairs = [[self._pair(r, c, divisible, shape) for c in cols] for r in rows]
        depth = max((len(t) for row in pairs for t in row if t is not None), default=0)
        local: dict[int, int] = {}
        for row in pairs:
            for terms in row:
                for t in terms or ():
                    local.setdefault(t, len(local))
        slots = np.full((depth, len(rows), len(cols)), len(local), dtype=np.intp)
        impossible = np.zeros((len(rows), len(cols)), dtype=bool)
        for r, row in enumerate(pairs):
            for c, terms in enumerate(row):
                if terms is None:
                    impossible[r, c] = True
                    continue
                for k, t in enumerate(terms):
                    slots[k, r, c] = local[t]
        return _Layout(tuple(local), slots, impossible)

    def _pair(
        self, src: int, dst: int, divisible: Divisibility, shape: tuple[int, ...]
    ) -> tuple[int, ...] | None:
        """Term ids of one move; any shape with the same divisibility gives the same."""
        # Divisibility only decides whether _fuse merges a run of reduce-scatters, and a run
        # needs two equal Partial source axes; other moves are the same for every shape.
        key = (src, dst, divisible if self._reduces[src] else None)
        terms = self._pairs.get(key, _UNSEEN)
        if terms is not _UNSEEN:
            return terms
        # The walk sees an axis placement only through its kind and which placements equal
        # it, so moves of one *form* (S(0)R -> _S(0,2)R and S(0)R -> _S(0,4)R, say) share it.
        seen: dict[int, int] = {}
        same = tuple(seen.setdefault(x, len(seen)) for x in self._axes[src] + self._axes[dst])
        form = (self._kinds[src], self._kinds[dst], same, key[2])
        terms = self._forms.get(form, _UNSEEN)
        if terms is _UNSEEN:
            a, b = self._placements[src], self._placements[dst]
            found = () if src == dst else moves(a, b, shape, self.redist.mesh_shape)
            terms = None if found is None else tuple(self._term(t) for t in found)
            self._forms[form] = terms
        self._pairs[key] = terms
        return terms

    def _term(self, term: Term) -> int:
        i = self._term_ids.get(term)
        if i is None:
            i = self._term_ids[term] = len(self._terms)
            self._terms.append(term)
        return i

    def _time(self, term: int, numel: int) -> float:
        key = (term, numel)
        t = self._times.get(key)
        if t is None:
            kind, axes, divisor = self._terms[term]
            p, m = self.redist.span(axes)
            # The same float expressions as RedistributeModel.steps.
            t = self._times[key] = self.redist.collectives.time_us(kind, numel / divisor, p, m)
        return t
