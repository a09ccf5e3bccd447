"""Redistribution prices of whole edges: one matrix per producer->consumer tensor.

Stage 4, cost (called by :mod:`autoplan.cost.price`). Input: an edge's distinct
source placements (rows), distinct target placements (columns), the tensor's
shape and element size. Output: the rows x columns matrix of microseconds, equal
bit for bit to :meth:`RedistributeModel.cost_us` pair by pair (``inf`` where the
move is impossible).

Why: priced pair by pair, an edge costs rows x columns calls into the cost model,
each walking DTensor's step order and the collective model in Python. But which
collectives a move runs, on which axis groups and on what fraction of the
tensor (:func:`~autoplan.cost.redistribute.moves`) depends on the shape only
through its rank and through which dims divide evenly by which flattened axis
groups, and on the placements only through their *form* (the codes of
:func:`~autoplan.cost.redistribute.encode`: each axis's kind and which
placements are equal, with the sharded dims themselves numbered by first
appearance, since only which placements shard the same dim matters). So each
(form, divisibility of the dims it shards) is walked once per planning run, an
edge's pairs become integer arrays of *terms* (collective, axes, divisor) once
per (rows, columns, divisibility), and a matrix costs one
``time_us`` per distinct term and bytes plus a few numpy gathers. The per-step
sums run in the same order as ``cost_us``'s, so the floats are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoplan.core.placements import Placements, is_strided, plain
from autoplan.core.torch_adapter import Placement
from autoplan.cost.keyed_ids import KeyedIds, intern
from autoplan.cost.redistribute import P_KIND, R_KIND, RedistributeModel, axis_kind, moves

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


class EdgePricer:
    """Prices edge matrices on one mesh; owns its caches for one planning run."""

    def __init__(self, redist: RedistributeModel) -> None:
        self.redist = redist
        mesh = redist.mesh_shape
        # Flattened groups _fuse may merge a reduce-scatter over: runs of adjacent axes.
        self._groups = [
            math.prod(mesh[i:j]) for i in range(len(mesh)) for j in range(i + 2, len(mesh) + 1)
        ]
        # Placement tuples, the placements of single axes and divisibilities, interned to
        # small ints so that the per-pair caches hash ints, not DTensor placements.
        self._ids: dict[Placements, int] = {}
        # The same, by tuple object: hashing a tuple hashes its placements, in Python for
        # DTensor's classes, and strategies share their tuple objects. Each entry holds its
        # tuple, so no id is reused while it is cached.
        self._seen: dict[int, tuple[Placements, int]] = {}
        self._seqs: dict[int, tuple[tuple[Placements, ...], tuple[int, ...]]] = {}
        self._axis_ids: dict[Placement, int] = {}
        self._label_sign: list[int] = []  # per axis id: -1 for a _StridedShard (see encode)
        self._axes: list[tuple[int, ...]] = []  # per placement tuple: its axis ids
        self._kinds: list[tuple[int, ...]] = []  # per placement tuple: axis_kind of each axis
        self._reduces: list[bool] = []  # may run a fused reduce-scatter (2+ Partial axes)
        self._divisible: dict[Divisibility, int] = {}
        self._divisibility: list[Divisibility] = []  # by id
        self._term_ids: dict[Term, int] = {}
        self._terms: list[Term] = []
        # Per (row, column, divisibility) pair, as one int key (see _pairs): its move's id.
        self._moves = KeyedIds()
        self._move_index: dict[tuple[int, ...] | None, int] = {}
        self._move_list: list[tuple[int, ...] | None] = []
        self._walks: dict[bytes, int] = {}  # a form (see _moves_of) -> its move's id
        self._forms: list[int] = []  # per placement tuple: the form of its own codes
        self._form_ids: dict[tuple[tuple[int, int], ...], int] = {}
        self._grid_walks: dict[int | bytes, int] = {}  # a pair's packed form (_grid) -> move id
        self._arrays: tuple[np.ndarray, ...] = ()  # see _tables
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...], int], _Layout] = {}
        self._times: dict[tuple[int, int], float] = {}

    def matrix(
        self,
        rows: Sequence[Placements],
        cols: Sequence[Placements],
        shape: tuple[int, ...],
        dtype_bytes: int,
    ) -> np.ndarray:
        """``cost[r, c] = redist.cost_us(rows[r], cols[c], shape, dtype_bytes)``, all at once."""
        return self.matrix_of_ids(self.ids(rows), self.ids(cols), shape, dtype_bytes)

    def matrix_of_ids(
        self, rows: tuple[int, ...], cols: tuple[int, ...], shape: tuple[int, ...], dtype_bytes: int
    ) -> np.ndarray:
        """:meth:`matrix` of placement tuples already turned into :meth:`ids`."""
        div = self._divisibility_id(shape)
        key = (rows, cols, div)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._layout(rows, cols, div, shape)
        numel = math.prod(shape) * dtype_bytes
        times = np.zeros(len(layout.terms) + 1)  # the last entry is the pad
        for k, term in enumerate(layout.terms):
            times[k] = self._time(term, numel)
        cost = np.zeros(layout.impossible.shape)
        for slot in layout.slots:
            cost += times[slot]  # step after step from 0, as cost_us sums them
        cost[layout.impossible] = math.inf
        return cost

    def pair_prices(
        self, src: np.ndarray, dst: np.ndarray, shape: tuple[int, ...], dtype_bytes: int
    ) -> np.ndarray:
        """The price of each move ``src[i] -> dst[i]`` (placement ids), as
        :meth:`matrix_of_ids` prices it: for a few pairs of many placements, not a grid."""
        which = self._keyed_moves(src, dst, self._divisibility_id(shape), shape)
        numel = math.prod(shape) * dtype_bytes
        per_move = np.full(len(self._move_list), math.inf)
        for m in np.unique(which).tolist():
            if (terms := self._move_list[m]) is not None:  # step after step, as cost_us sums
                per_move[m] = sum(self._time(t, numel) for t in terms)
        return per_move[which]

    def _divisibility_id(self, shape: tuple[int, ...]) -> int:
        """The id of which dims of ``shape`` divide by each flattened group of axes."""
        divisible = tuple(tuple(n % g == 0 for g in self._groups) for n in shape)
        return intern(self._divisible, self._divisibility, divisible)

    def ids(self, placements: Sequence[Placements]) -> tuple[int, ...]:
        """Small ints standing for placement tuples, the same int for equal tuples."""
        # Hash each placement tuple once per edge; the caches below key on small ints.
        # An edge side's tuple of placements is shared by the edges of twin nodes.
        if isinstance(placements, tuple):
            hit_seq = self._seqs.get(id(placements))
            if hit_seq is not None and hit_seq[0] is placements:
                return hit_seq[1]
        out = []
        seen = self._seen
        for p in placements:
            hit = seen.get(id(p))
            if hit is not None and hit[0] is p:
                out.append(hit[1])
                continue
            i = self._ids.get(p)
            if i is None and (q := plain(p)) is not p:  # _S(d,1): the id of its S(d) spelling
                i = self._ids[p] = self.ids([q])[0]
            if i is None:
                i = self._ids[p] = len(self._axes)
                self._axes.append(tuple(self._axis_id(x) for x in p))
                self._kinds.append(tuple(axis_kind(x) for x in p))
                self._reduces.append(self._kinds[-1].count(P_KIND) >= 2)
                own = self._codes(self._axes[-1], self._kinds[-1], {}, {})
                self._forms.append(self._form_ids.setdefault(own, len(self._form_ids)))
            seen[id(p)] = (p, i)
            out.append(i)
        if isinstance(placements, tuple):
            self._seqs[id(placements)] = (placements, tuple(out))
        return tuple(out)

    def _axis_id(self, x: Placement) -> int:
        a = self._axis_ids.get(x)
        if a is None:
            a = self._axis_ids[x] = len(self._label_sign)
            self._label_sign.append(-1 if is_strided(x) else 1)
        return a

    def _layout(
        self,
        rows: tuple[int, ...],
        cols: tuple[int, ...],
        div: int,
        shape: tuple[int, ...],
    ) -> _Layout:
        r_ids, c_ids = np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
        which = np.empty((len(rows), len(cols)), dtype=np.intp)
        fused = self._tables()[3][r_ids]
        plain = np.flatnonzero(~fused)
        if len(plain):
            which[plain] = self._grid(r_ids[plain], c_ids, shape)
        if fused.any():
            which[fused] = self._pairs(r_ids[fused], c_ids, div, shape)
        # the moves present, and each pair's index among them (move ids are small ints)
        present = np.flatnonzero(np.bincount(which.ravel(), minlength=len(self._move_list)))
        index = np.zeros(len(self._move_list), dtype=np.intp)
        index[present] = np.arange(len(present))
        inverse = index[which]
        distinct = [self._move_list[m] for m in present.tolist()]
        local: dict[int, int] = {}
        for terms in distinct:
            for t in terms or ():
                local.setdefault(t, len(local))
        depth = max((len(t) for t in distinct if t is not None), default=0)
        table = np.full((len(distinct), depth), len(local), dtype=np.intp)
        for u, terms in enumerate(distinct):
            for k, t in enumerate(terms or ()):
                table[u, k] = local[t]
        slots = np.ascontiguousarray(np.moveaxis(table[inverse], -1, 0))
        impossible = (present == self._move_id(None))[inverse]
        return _Layout(tuple(local), slots, impossible)

    def _grid(self, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Move ids of every (row, column) pair of placement ids, rows that cannot run a
        fused reduce-scatter only (their moves fit every shape).

        A pair's form (:meth:`_moves_of`) is a function of the row's own form, the
        column's, and which of the row's axes hold the same placement (or shard the
        same dim) as which of the column's: those pack into one int per pair, made for
        the whole grid in numpy (no dict lookup per pair), and one pair per new int is
        walked. Meshes of four or five axes pack into two int64s a pair; larger ones go by
        pair.
        """
        n = len(self.redist.mesh_shape)
        if len(self._form_ids) >= 1 << 20 or 2 * n * n > 63:  # does not pack: by pair
            return self._pairs(rows, cols, -1, shape)
        axes, kinds, forms, _ = self._tables()
        ra, rk, ca, ck = axes[rows].T, kinds[rows].T, axes[cols].T, kinds[cols].T
        # Bit i*n + j (+ n*n for the held placement) says row axis i and column axis j
        # shard the same dim (hold the same placement, not R). Per row and placement (or
        # dim), the bits i*n of the axes holding it; a column's axis j reads its own
        # placement's (dim's) bits, shifted by j. The last entry is R's (no dim's): 0.
        at = np.arange(len(rows))
        held = np.zeros((len(rows), len(self._label_sign) + 1), dtype=np.int64)
        dims = np.zeros((len(rows), max(int(kinds.max()), -1) + 2), dtype=np.int64)
        for i in range(n):
            held[at, np.where(rk[i] != R_KIND, ra[i], -1)] += 1 << (i * n)
            dims[at, np.where(rk[i] >= 0, rk[i], -1)] += 1 << (i * n)
        held[:, -1] = dims[:, -1] = 0
        relation = np.zeros((len(rows), len(cols)), dtype=np.int64)
        for j in range(n):
            relation |= held[:, np.where(ck[j] != R_KIND, ca[j], -1)] << (j + n * n)
            relation |= dims[:, np.where(ck[j] >= 0, ck[j], -1)] << j
        pair_forms = forms[rows][:, None] << 20 | forms[cols][None, :]
        if 2 * n * n + 40 <= 63:  # one int64 a pair
            key = (pair_forms << (2 * n * n) | relation).ravel()
        else:  # two int64 a pair (meshes of 4 and 5 axes), compared as one 16-byte value
            both = np.stack([np.broadcast_to(pair_forms, relation.shape), relation], axis=2)
            key = np.ascontiguousarray(both).reshape(-1, 2).view("V16").ravel()
        distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        ids = np.empty(len(distinct), dtype=np.intp)
        for u, (k, i) in enumerate(zip(distinct.tolist(), first.tolist(), strict=True)):
            m = self._grid_walks.get(k)
            if m is None:
                r, c = divmod(i, len(cols))
                m = self._move_id(self._pair(int(rows[r]), int(cols[c]), shape))
                self._grid_walks[k] = m
            ids[u] = m
        return ids[inverse.ravel()].reshape(len(rows), len(cols))

    def _pairs(
        self, rows: np.ndarray, cols: np.ndarray, div: int, shape: tuple[int, ...]
    ) -> np.ndarray:
        """:meth:`_keyed_moves` of every (row, column) pair, as a grid."""
        src, dst = np.repeat(rows, len(cols)), np.tile(cols, len(rows))
        return self._keyed_moves(src, dst, div, shape).reshape(len(rows), len(cols))

    def _keyed_moves(
        self, src: np.ndarray, dst: np.ndarray, div: int, shape: tuple[int, ...]
    ) -> np.ndarray:
        """:meth:`_moves_of`, at ``div`` where the source may fuse a reduce-scatter (else
        -1), each pair looked up first among those seen before: networks of one tensor
        rank share most of them. A key packs (src, dst, div) in 23, 24 and 16 bits."""
        d = np.where(self._tables()[3][src], div, -1)
        keys = (src.astype(np.int64) << 40) + (dst.astype(np.int64) << 16) + (d + 1)
        which = self._moves.get(keys)
        miss = np.flatnonzero(which < 0)
        if len(miss):
            which[miss] = self._moves_of(src[miss], dst[miss], d[miss], shape)
            self._moves.add(keys[miss], which[miss])
        return which

    def _moves_of(
        self, src: np.ndarray, dst: np.ndarray, div: np.ndarray, shape: tuple[int, ...]
    ) -> np.ndarray:
        """Move ids of the pairs (src[i], dst[i]) of placement ids at divisibility div[i]
        (-1: a move that fits every shape). Pairs of one form share a walk: the forms are
        made for all pairs at once in numpy rather than pair by pair in Python, and one pair
        per form never seen before is walked (:meth:`_pair`).
        """
        if not len(src):
            return np.zeros(0, dtype=np.intp)
        axes, kinds, _, _ = self._tables()
        ax = np.concatenate([axes[src], axes[dst]], axis=1)
        kind = np.concatenate([kinds[src], kinds[dst]], axis=1)
        dim = np.where(kind >= 0, _first_seen(kind, kind >= 0), kind)
        sign = np.array(self._label_sign)[ax]
        label = np.where(kind == R_KIND, 0, (_first_seen(ax, kind != R_KIND) + 1) * sign)
        # Where the divisibility matters, a form also holds whether each sharded dim
        # divides by each flattened group: per entry, as bits (0 where it does not matter;
        # a form whose divisibility matters has two P source axes, so the codes alone tell
        # the two kinds of form apart).
        bits = np.zeros_like(kind)
        for v in np.unique(div[div >= 0]).tolist():
            per_dim = [sum(b << g for g, b in enumerate(x)) for x in self._divisibility[v]]
            at = (div == v)[:, None] & (kind >= 0)
            bits[at] = np.array(per_dim)[kind[at]]
        form = np.ascontiguousarray(np.stack([dim, label, bits], axis=2), dtype=np.int16)
        keys = form.reshape(len(src), -1).view(f"V{2 * form[0].size}").ravel()
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        ids = np.empty(len(distinct), dtype=np.intp)
        for u, (key, i) in enumerate(zip(distinct.tolist(), first.tolist(), strict=True)):
            m = self._walks.get(key)
            if m is None:
                m = self._walks[key] = self._move_id(self._pair(int(src[i]), int(dst[i]), shape))
            ids[u] = m
        return ids[inverse.ravel()]

    def _tables(self) -> tuple[np.ndarray, ...]:
        """The per-placement-id lists (axis ids, kinds, forms, may-fuse) as arrays, made
        again only when :meth:`ids` has added placements since (a run's ids come before
        its layouts, which read these many times)."""
        if not self._arrays or len(self._arrays[0]) != len(self._axes):
            self._arrays = (
                np.array(self._axes, dtype=np.int64),
                np.array(self._kinds, dtype=np.int64),
                np.array(self._forms, dtype=np.int64),
                np.array(self._reduces, dtype=bool),
            )
        return self._arrays

    def _move_id(self, terms: tuple[int, ...] | None) -> int:
        """A small int per distinct move (its terms, or None when impossible)."""
        return intern(self._move_index, self._move_list, terms)

    def _pair(self, src: int, dst: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """Term ids of one move, walked on ``shape``: every pair with its form
        (:meth:`_moves_of`) gives the same, whatever its shape."""
        # The codes of redistribute.encode with labels and sharded dims both numbered by
        # first appearance: the walk depends on a dim only through which placements shard
        # it and, for a fused reduce-scatter, whether it divides evenly, so S(0)S(1) ->
        # S(1)S(0) and S(2)S(3) -> S(3)S(2) (or S(0)R -> _S(0,2)R and S(0)R -> _S(0,4)R)
        # share one walk.
        dims: dict[int, int] = {}
        codes = self._codes(
            self._axes[src] + self._axes[dst], self._kinds[src] + self._kinds[dst], {}, dims
        )
        n = len(self._axes[src])
        renumbered = tuple(shape[d] for d in dims)  # sizes of the numbered dims, in order
        found = moves(codes[:n], codes[n:], renumbered, self.redist.mesh_shape)
        return None if found is None else tuple(self._term(t) for t in found)

    def _codes(
        self,
        axes: tuple[int, ...],
        kinds: tuple[int, ...],
        labels: dict[int, int],
        dims: dict[int, int],
    ) -> tuple[tuple[int, int], ...]:
        """:func:`~autoplan.cost.redistribute.encode`'s codes with labels and sharded dims
        numbered by first appearance (``labels``, ``dims``: the numbering, filled in)."""
        return tuple(
            (
                k if k < 0 else dims.setdefault(k, len(dims)),
                0 if k == R_KIND else self._label_sign[a] * labels.setdefault(a, len(labels) + 1),
            )
            for a, k in zip(axes, kinds, strict=True)
        )

    def _term(self, term: Term) -> int:
        return intern(self._term_ids, self._terms, term)

    def _time(self, term: int, numel: int) -> float:
        key = (term, numel)
        t = self._times.get(key)
        if t is None:
            kind, axes, divisor = self._terms[term]
            p, m = self.redist.span(axes)
            # The same float expressions as RedistributeModel.steps.
            t = self._times[key] = self.redist.collectives.time_us(kind, numel / divisor, p, m)
        return t


def _first_seen(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row and masked entry, the 0-based rank of its value among the row's masked
    values in order of first appearance (what ``dict.setdefault(v, len(dict))`` gives
    walking the row); unmasked entries get ranks that mean nothing."""
    width = values.shape[1]
    same = (values[:, :, None] == values[:, None, :]) & mask[:, None, :]
    first = same.argmax(axis=2)  # the first masked entry with the same value
    new = mask & (first == np.arange(width))
    before = np.cumsum(new, axis=1) - new  # values first seen before each entry
    return np.take_along_axis(before, first, axis=1)
