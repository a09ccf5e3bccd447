"""Stage 5c (bound), dual layout: the arrays a sweep of :mod:`autoplan.ilp.bound.dual` reads.

Input: one edge end's groups and allowed strategies (:class:`End`), the ends at a
class (:class:`Visit`), lists of arrays (:func:`flat`). Output: the same data laid
out so that a visit to a class costs a few numpy calls per class and per edge, and an
edge's potentials as the ascent's result reads them (:class:`Potentials`).

Why: on small meshes the sweeps are numpy call overhead far more than arithmetic, so
what a visit needs is gathered once, here, not per visit; on a 4-D mesh an edge holds
millions of prices and a sweep is memory traffic, so an edge's potentials are formed
from its prices and messages where they are read, not stored and rewritten (nor, in
the result, kept whole: an edge's full matrix is its groups squared, the blocks' a third
of that under three checkpointing modes), and in float32 rounded down
(:func:`rounded_down`): half the bytes, and still a lower bound.
"""

from __future__ import annotations

import itertools

import numpy as np

from autoplan.ilp.formulation.problem import Problem

# Prices read per numpy call when an edge's minima are taken (whole rows, at least one):
# the prices less a message are formed in a buffer this size, which stays in cache.
_CHUNK = 1 << 16


class End:
    """One end of an edge at a class, with the edge's prices kept compact: only the groups
    an allowed strategy maps to, ``edge`` indexed (diagonal block, source group in it,
    destination group) and shared by both ends, and this end's message ``msg``. The edge's
    potentials are never stored: φ = prices - source message - destination message, formed
    a few rows at a time where minima are taken. An edge whose finite prices lie in
    diagonal blocks keeps those only (:func:`diagonal_blocks`); any other edge is one
    block."""

    def __init__(self, k: int, axis: int, group: np.ndarray, ok: np.ndarray) -> None:
        self.k, self.axis, self.group = k, axis, group
        self.safe = np.maximum(group, 0)
        self.bad = (group < 0) & ok  # an allowed strategy with no group cannot be chosen
        members = np.flatnonzero(ok & (group >= 0))
        self.order = members[np.argsort(group[members], kind="stable")]
        # the distinct groups in order and where each begins (np.unique of a sorted array,
        # without its sort: an end is made per edge per ascent)
        ordered = group[self.order]
        self.starts = (
            np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else ordered
        )
        self.present = ordered[self.starts]
        local = np.zeros(int(group.max(initial=0)) + 1, dtype=np.int64)
        local[self.present] = np.arange(len(self.present))
        self.local = local[self.safe]  # compact group of each strategy (0 if none)
        self.size = 0
        self.edge = np.zeros((1, 0, 0))
        self.msg = np.zeros(0)
        self.partner = self
        self.guard = False  # some group of this end has no finite price
        self.other = 0  # the position of the class at the other end

    def attach(
        self, edge: np.ndarray, partner: End, size: int, other: int, finite: np.ndarray
    ) -> None:
        """Take the edge's compact prices (shared with ``partner``, the other end), this
        end's group count before compacting, the other class's position and which prices
        are finite (computed once per edge, for both ends)."""
        self.edge, self.partner, self.size, self.other = edge, partner, size, other
        blocks, rows, cols = edge.shape
        self.msg = np.zeros(blocks * (rows if self.axis == 0 else cols))
        self.guard = not bool(finite.any(axis=2 - self.axis).all())
        self._step = max(1, _CHUNK // max(1, blocks * cols))

    def row_minima(self) -> np.ndarray:
        """The least potential of each of this end's compact groups (inf where none): the
        least over the other end's groups of prices less the other end's message."""
        edge, step, axis = self.edge, self._step, self.axis
        blocks, rows, cols = edge.shape
        # in the prices' own float32: any messages give a valid bound, and the result's
        # bound is formed again in float64 (Potentials)
        other = self.partner.msg.astype(edge.dtype).reshape(blocks, -1)
        other = other[:, None, :] if axis == 0 else other[:, :, None]
        out: np.ndarray
        if not edge.size:
            out = np.full((blocks, rows if axis == 0 else cols), np.inf)
        elif step >= rows:  # in one piece: a small edge costs numpy calls, not arithmetic
            out = (edge - other).min(axis=2 - axis)
        else:  # a few rows at a time, in a buffer that stays in cache
            shape = (blocks, rows) if axis == 0 else (blocks, cols)
            out = np.full(shape, np.inf, dtype=edge.dtype)
            buf = np.empty((blocks, step, cols), dtype=edge.dtype)
            other = np.broadcast_to(other, edge.shape)  # a view: sliced by rows as the edge
            for lo in range(0, rows, step):
                part = buf[:, : min(step, rows - lo)]
                np.subtract(edge[:, lo : lo + step], other[:, lo : lo + step], out=part)
                if axis == 0:
                    np.minimum.reduce(part, axis=2, out=out[:, lo : lo + step])
                else:
                    np.minimum(out, part.min(axis=1), out=out)
        return out.ravel() - self.msg

    def take(self, c: np.ndarray) -> None:
        """Move ``c`` (per compact group) from the edge's potentials to this end's message."""
        self.msg += c

    def full_message(self) -> np.ndarray:
        out = np.zeros(self.size)
        out[self.present] = self.msg
        return out


class Visit:
    """What a visit to one class in one direction reads, laid out so that it costs a few
    numpy calls per class and per edge: ``local`` maps every end's compact groups, stacked,
    to the class's strategies; ``order``/``starts`` list the ends ahead's groups for one
    ``reduceat`` and ``back`` maps the shares it yields to the strategies; ``ahead`` is
    (position in ``ends``, slice of the shares) per end ahead; ``share`` what each gets."""

    def __init__(self, ends: list[End], is_ahead: list[bool]) -> None:
        self.ends = ends
        sizes = np.cumsum([0] + [len(end.msg) for end in ends])
        locals_ = [end.local + sizes[k] for k, end in enumerate(ends)]
        self.local = locals_[0] if len(ends) == 1 else np.stack(locals_ or [np.zeros(0, int)])
        n_ahead = sum(is_ahead)
        self.share = 1.0 / max(n_ahead, len(ends) - n_ahead, 1)
        self.order: np.ndarray | None = None
        self.ahead: list[tuple[int, int, int]] = []
        orders: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        backs: list[np.ndarray] = []
        lo = 0
        for k, end in enumerate(ends):
            if is_ahead[k] and len(end.order):
                starts.append(end.starts + sum(len(o) for o in orders))
                orders.append(end.order)
                backs.append(end.local + lo)
                self.ahead.append((k, lo, lo + len(end.starts)))
                lo += len(end.starts)
        if orders:
            self.order, self.starts = np.concatenate(orders), np.concatenate(starts)
            self.back = backs[0] if len(backs) == 1 else np.stack(backs)


class Potentials:
    """One edge's potentials φ = prices - source message - destination message, as a
    :class:`~autoplan.ilp.bound.dual.Dual` reads them: the compact prices (shared with the
    ascent's ends, never written) and copies of the two messages, formed per row, per
    column or whole where read. Indexed by the edge's own groups (``shape``): a group no
    allowed strategy maps to, or a pair outside the diagonal blocks, has φ = inf.
    ``row_min``/``col_min`` are φ's least per source and per destination group."""

    def __init__(self, s: End, d: End) -> None:
        self.prices = s.edge
        blocks, rows, cols = s.edge.shape
        self.a = s.msg.reshape(blocks, rows).copy()  # the ends' messages move on
        self.b = d.msg.reshape(blocks, cols).copy()
        self.row_groups, self.col_groups = s.present, d.present  # sorted, as compacted
        self.shape = (s.size, d.size)
        self.row_min, self.col_min = self._minima(s._step)

    def _minima(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """φ's least per row and per column, ``step`` rows at a time (the source end's)."""
        blocks, rows, cols = self.prices.shape
        row_min, col_min = np.full(self.shape[0], np.inf), np.full(self.shape[1], np.inf)
        if not self.prices.size:
            return row_min, col_min
        by_row, by_col = np.empty((blocks, rows)), np.full((blocks, cols), np.inf)
        for lo in range(0, rows, step):
            part = self.prices[:, lo : lo + step] - self.a[:, lo : lo + step, None]
            part -= self.b[:, None, :]
            np.minimum.reduce(part, axis=2, out=by_row[:, lo : lo + step])
            np.minimum(by_col, part.min(axis=1), out=by_col)
        row_min[self.row_groups] = by_row.ravel()
        col_min[self.col_groups] = by_col.ravel()
        return row_min, col_min

    def row(self, g: int) -> np.ndarray:
        """φ[g, :], over every destination group."""
        out = np.full(self.shape[1], np.inf)
        at = _position(self.row_groups, g)
        if at is not None:
            block, i = divmod(at, self.prices.shape[1])
            cols = self.prices.shape[2]
            line = self.prices[block, i] - self.a[block, i]
            out[self.col_groups[block * cols : (block + 1) * cols]] = line - self.b[block]
        return out

    def column(self, h: int) -> np.ndarray:
        """φ[:, h], over every source group."""
        out = np.full(self.shape[0], np.inf)
        at = _position(self.col_groups, h)
        if at is not None:
            block, j = divmod(at, self.prices.shape[2])
            rows = self.prices.shape[1]
            line = self.prices[block, :, j] - self.a[block]
            out[self.row_groups[block * rows : (block + 1) * rows]] = line - self.b[block, j]
        return out

    def full(self) -> np.ndarray:
        """φ whole, shaped ``shape`` (for the small edges laid out as pair columns)."""
        out = np.full(self.shape, np.inf)
        _, rows, cols = self.prices.shape
        for block, prices in enumerate(self.prices):
            at = np.ix_(
                self.row_groups[block * rows : (block + 1) * rows],
                self.col_groups[block * cols : (block + 1) * cols],
            )
            out[at] = prices - self.a[block][:, None] - self.b[block][None, :]
        return out


def _position(sorted_groups: np.ndarray, g: int) -> int | None:
    """Where group ``g`` sits in ``sorted_groups`` (None: absent)."""
    at = int(np.searchsorted(sorted_groups, g))
    return at if at < len(sorted_groups) and sorted_groups[at] == g else None


def rounded_down(prices: np.ndarray) -> np.ndarray:
    """``prices`` in float32, each one float32 rounds up stepped down to the float below:
    a sweep reads half the bytes, and every potential formed from them is at most the
    exact one, so each bound and reduced cost stays a lower bound."""
    low = prices.astype(np.float32)
    up = low > prices
    low[up] = np.nextafter(low[up], np.float32(-np.inf))
    return low


def mode_blocks(p: Problem, src: str, dst: str) -> int:
    """How many diagonal blocks an edge between classes src and dst may split into: the
    mode blocks both share (:attr:`Problem.blocks`), else 1."""
    if src not in p.blocks or dst not in p.blocks:
        return 1
    return min(len(p.linear[src]) // p.blocks[src][1], len(p.linear[dst]) // p.blocks[dst][1])


def diagonal_blocks(mat: np.ndarray, count: int) -> np.ndarray:
    """``mat`` as ``count`` diagonal blocks, shaped (block, row, column), when it splits
    into that many equal ones with no finite price outside them; else ``mat[None]``."""
    rows, cols = mat.shape
    if count < 2 or rows % count or cols % count:
        return mat[None]
    n, m = rows // count, cols // count
    blocks = mat.reshape(count, n, count, m).transpose(0, 2, 1, 3)
    # block by block: a mask over the blocks outside would copy two thirds of the prices
    for i, j in itertools.permutations(range(count), 2):
        if np.isfinite(blocks[i, j]).any():
            return mat[None]
    return np.ascontiguousarray(blocks[np.arange(count), np.arange(count)])


def flat(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One buffer holding ``arrays`` back to back, and a view of it shaped like each."""
    buf = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    views, at = [], 0
    for a in arrays:
        views.append(buf[at : at + a.size].reshape(a.shape))
        at += a.size
    return buf, views


def starts(views: list[np.ndarray]) -> np.ndarray:
    """Where each non-empty view begins in its buffer (for ``reduceat``)."""
    offsets = np.cumsum([0] + [v.size for v in views])[:-1]
    return np.array([o for o, v in zip(offsets.tolist(), views, strict=True) if v.size], np.intp)
