"""Stage 5b (formulation), prune: drop dominated strategies, an exact reduction of the ILP.

Input: a simplified :class:`~autoplan.ilp.formulation.problem.Problem`. Output: the same
problem with fewer allowed strategies (edited in place) and the number removed. Why:
fewer strategies are fewer columns, and no optimum is lost.

Strategy i *dominates* strategy j of class r when, with every other class's
choice held, choosing i never costs more nor breaks more than j:

* ``linear[r][i] <= linear[r][j]`` (compute plus folded moves),
* ``memory[r][i] <= memory[r][j]`` when a memory budget is set,
* on every incident edge, i's row (column) of prices is ``<=`` j's
  elementwise over the groups the other end can still choose (``inf`` only
  where j's is ``inf`` too).

Take any optimum choosing j: switching r to i keeps it feasible and no
dearer, so some optimum avoids j, and j can go. Equal strategies dominate
each other; the lower index stays. Pruning is done for all classes at once
against the strategies allowed before the round, which the argument allows
(each switch is checked against a superset of what is left), then
:func:`~autoplan.ilp.formulation.problem.simplify` drops the rows and columns nothing
maps to any more, which can make more strategies dominated; rounds repeat to
a fixpoint or ``max_rounds`` (:func:`~autoplan.ilp.formulation.build.build_ilp` runs one:
later rounds remove few strategies and do not speed up the solve). A strategy
forbidden by the user was never allowed, so it never dominates: constrained choices
only lose strategies to allowed ones.

This is the pruning of Alpa-style planners made exact (Zheng et al., OSDI
2022, section 4.2 prunes by heuristics instead).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from autoplan.cost.block_diagonal import BlockDiagonal
from autoplan.ilp.formulation.distinct import distinct_rows
from autoplan.ilp.formulation.problem import Edge, Problem, simplify

# Classes of this many strategies or more are checked on worker threads.
_THREADED = 256
_WORKERS = max(1, min(4, os.cpu_count() or 1))


def _widths(p: Problem, r: str, edges: list[tuple[Edge, bool]]) -> list[int]:
    """The columns of class r's features (:func:`_features`): its cost, its memory under a
    budget, then each edge's prices."""
    memory = [1] if p.budget is not None and r in p.memory else []
    return [1, *memory] + [e.cost.shape[1] if is_src else e.cost.shape[0] for e, is_src in edges]


def _features(
    p: Problem,
    r: str,
    idx: np.ndarray,
    edges: list[tuple[Edge, bool]],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """One row per allowed strategy: every price and amount that must not be worse (in
    ``out`` when given, ``len(idx)`` rows as wide as :func:`_widths` sums).

    Written into one array block by block, each edge's prices gathered by rows: on a 4-D
    mesh a class's features are hundreds of megabytes, and gathering a destination's
    columns, then stacking, copies them twice through strided reads."""
    widths = _widths(p, r, edges)
    if out is None:
        out = np.empty((len(idx), sum(widths)))
    out[:, 0] = p.linear[r][idx]
    if len(widths) > len(edges) + 1:
        out[:, 1] = p.memory[r][idx]
    at = len(widths) - len(edges)
    for (e, is_src), width in zip(edges, widths[at:], strict=True):
        if is_src:
            part = e.cost[e.src_group[idx]]
        elif isinstance(e.cost, BlockDiagonal):
            part = e.cost[:, e.dst_group[idx]].T
        else:
            # a destination's column per strategy: rows of the transpose, made contiguous
            # once when the strategies are at least as many as the columns
            by_row = np.ascontiguousarray(e.cost.T) if len(idx) >= e.cost.shape[1] else e.cost.T
            part = by_row[e.dst_group[idx]]
        np.multiply(part, e.scale, out=out[:, at : at + width])  # the class's prices
        at += width
    return out


def dominated(f: np.ndarray, probe: int = 48, chunk: int = 4096, span: int = 64) -> np.ndarray:
    """Rows of ``f`` that another row is <= everywhere (the first of equal rows stays).

    A column equal in every row is dropped first: it holds for every pair (a mode block's
    columns of another block's edges are all ``inf`` in it, two thirds of them for three).
    A repeated row goes at once, and only the distinct rows are compared: many rows of a
    large class repeat another, and comparing them again gives the same answer.
    """
    varies = (f != f[0]).any(axis=0) if len(f) else np.ones(f.shape[1], dtype=bool)
    keep, _ = distinct_rows(f)
    if len(keep) == len(f):
        return _distinct_dominated(
            f if varies.all() else f[:, varies], probe=probe, chunk=chunk, span=span
        )
    out = np.ones(len(f), dtype=bool)  # a later copy of a row loses to the first
    out[keep] = _distinct_dominated(f[np.ix_(keep, varies)], probe=probe, chunk=chunk, span=span)
    return out


def dominated_in_blocks(f: np.ndarray, block: np.ndarray | None) -> np.ndarray:
    """:func:`dominated`, block by block when no row of one block can be <= a row of
    another: a column holds ``inf`` in every row of the first and a finite price in every
    row of the second (an ``auto`` layer's mode blocks, whose edges are block diagonal).
    Then the pairs across blocks need no comparing: a third of the pairs for three."""
    blocks = np.unique(block) if block is not None else ()
    if block is None or len(blocks) < 2:
        return dominated(f)
    rows = [_rows_of(block, b) for b in blocks]
    finite_f = np.isfinite(f)
    if not _kept_apart([_finite_spans(finite_f[r]) for r in rows]):
        return dominated(f)
    out = np.zeros(len(f), dtype=bool)
    for r in rows:
        out[r] = dominated(f[r])
    return out


def _finite_spans(finite: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of a block's finiteness: finite in some row, finite in every row."""
    return np.asarray(finite.any(axis=0)), np.asarray(finite.all(axis=0))


def _kept_apart(spans: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether no row of one block can be <= a row of another, from each block's
    :func:`_finite_spans`: for every ordered pair, a column finite in every row of the
    second and in no row of the first."""
    return all(
        (spans[upper][1] & ~spans[lower][0]).any()
        for lower, upper in itertools.permutations(range(len(spans)), 2)
    )


def _rows_of(block: np.ndarray, b: int) -> np.ndarray | slice:
    """The rows of block ``b``: a slice when they are one run (a mode block's strategies
    are), so that its rows are read in place rather than copied out of features of
    hundreds of megabytes."""
    at = np.flatnonzero(block == b)
    if len(at) and at[-1] - at[0] + 1 == len(at):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def _distinct_dominated(
    f: np.ndarray, probe: int = 48, chunk: int = 4096, span: int = 64
) -> np.ndarray:
    """:func:`dominated` by comparing rows pairwise.

    Only pairs (i, k) with row i <= row k on ``probe`` spread-out columns can pass on
    all, and there are few; only they are compared on every column. The probe compares
    small ints, each column's values replaced by their rank among its distinct values
    (a price matrix holds a few dozen per column), one column at a time over the whole
    n x n grid (cheaper than gathering the pairs a first few columns leave). The same
    answer as comparing every pair on every column, with small temporaries: no n x n x
    probe array of prices.
    """
    n, width = f.shape
    cols = np.unique(np.linspace(0, width - 1, min(probe, width)).astype(np.int64))
    rank = np.empty((len(cols), n), dtype=np.uint8)
    for q, c in enumerate(cols):
        _, where = np.unique(f[:, c], return_inverse=True)
        # ranks past 255 merge: the probe then passes more pairs, never fewer
        rank[q] = np.minimum(where.ravel(), 255)
    maybe = np.ones((n, n), dtype=bool)
    le = np.empty((n, n), dtype=bool)
    for q in range(len(cols)):
        np.less_equal(rank[q][:, None], rank[q][None, :], out=le)
        maybe &= le
    np.fill_diagonal(maybe, False)
    i, k = np.nonzero(maybe)
    # The rows lowest on the probe first: they are below the most others, and a row found
    # dominated needs no second witness, so its pairs left are skipped.
    order = np.argsort(rank.sum(axis=0, dtype=np.int64)[i], kind="stable")
    i, k = i[order], k[order]
    out = np.zeros(n, dtype=bool)
    for start in range(0, len(i), chunk):
        a, b = i[start : start + chunk], k[start : start + chunk]
        open_ = ~out[b]
        a, b = a[open_], b[open_]
        for lo in range(0, width, span):  # most pairs fail early: a span of columns at a time
            below = (f[a, lo : lo + span] <= f[b, lo : lo + span]).all(axis=1)
            a, b = a[below], b[below]
            if not len(a):
                break
        same = (f[a] >= f[b]).all(axis=1)
        out[b[~same | (a < b)]] = True  # better, or equal and earlier
    return out


def _judge(
    p: Problem,
    r: str,
    idx: np.ndarray,
    edges: list[tuple[Edge, bool]],
    seen: dict[str, np.ndarray] | None,
) -> np.ndarray | None:
    """Which of class r's allowed strategies ``idx`` are dominated (None: its features are
    those ``seen`` holds from the round before, so none is). Its features are built here,
    on the thread that judges it, and dropped after unless ``seen`` keeps them."""
    if seen is None and r in p.blocks:
        apart = _apart(p, r, idx, edges)
        if apart is not None:
            return apart
    f = _features(p, r, idx, edges)
    last = seen.get(r) if seen is not None else None
    if seen is not None:
        seen[r] = f
    if last is not None and np.array_equal(last, f):  # False on another shape
        return None
    return dominated_in_blocks(f, idx // p.blocks[r][1] if r in p.blocks else None)


def _apart(
    p: Problem, r: str, idx: np.ndarray, edges: list[tuple[Edge, bool]]
) -> np.ndarray | None:
    """:func:`dominated_in_blocks` of class r's features with its mode blocks judged apart,
    each block's features built in turn into one buffer: a third of the memory for three
    modes, and the pages of one block's array reused by the next. None when the blocks
    cannot be judged apart (the caller then judges the features whole)."""
    block = idx // p.blocks[r][1]
    rows = [_rows_of(block, b) for b in np.unique(block)]
    if len(rows) < 2:
        return None
    sizes = [len(idx[rw]) for rw in rows]
    buf = np.empty((max(sizes), sum(_widths(p, r, edges))))
    out = np.zeros(len(idx), dtype=bool)
    spans = []
    for rw, size in zip(rows, sizes, strict=True):
        f = _features(p, r, idx[rw], edges, out=buf[:size])
        spans.append(_finite_spans(np.isfinite(f)))
        out[rw] = dominated(f)
    return out if _kept_apart(spans) else None


def _prune_round(p: Problem, seen: dict[str, np.ndarray] | None) -> int:
    """One round over every class; ``seen`` holds each class's features from the round
    before, and a class whose features have not changed since is skipped: it lost no
    strategy then (or its features would be shorter now), so none dominates another.
    With ``seen`` None (no round follows) no class's features outlive its judging: on a
    4-D mesh they are gigabytes together."""
    incident = p.incident()
    todo: list[tuple[str, np.ndarray]] = []
    for r, cost in p.linear.items():
        idx = np.flatnonzero(np.isfinite(cost))
        if len(idx) >= 2:
            todo.append((r, idx))
    # The big checks run on worker threads while this one checks the small classes: their
    # numpy passes over n x n arrays release the GIL.
    bad: dict[str, np.ndarray] = {}
    with ThreadPoolExecutor(_WORKERS) as pool:
        pending = {
            r: pool.submit(_judge, p, r, idx, incident[r], seen)
            for r, idx in todo
            if len(idx) >= _THREADED
        }
        small = [t for t in todo if t[0] not in pending]
        for r, idx in small + [t for t in todo if t[0] in pending]:
            drop = pending[r].result() if r in pending else _judge(p, r, idx, incident[r], seen)
            if drop is not None and drop.any():
                bad[r] = idx[drop]
    for r, gone in bad.items():  # after the loop: every class judged against the same sets
        p.linear[r][gone] = np.inf
    return sum(len(g) for g in bad.values())


def prune_dominated(p: Problem, *, max_rounds: int = 50) -> int:
    """Remove dominated strategies to a fixpoint, or for ``max_rounds`` rounds; returns how
    many were removed."""
    removed = 0
    seen: dict[str, np.ndarray] = {}
    for k in range(max_rounds):
        n = _prune_round(p, seen if k + 1 < max_rounds else None)
        if n == 0:
            break
        removed += n
        simplify(p)
    return removed
