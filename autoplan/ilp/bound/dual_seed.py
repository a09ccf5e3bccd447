"""Stage 5c (bound), dual seed: where an ascent of :mod:`autoplan.ilp.bound.dual` starts
when it does not start from zero messages.

Input: the edge ends of an ascent on one problem (:class:`~autoplan.ilp.bound.dual_layout.End`
pairs), and either a warm snapshot (an ascent on the same problem under another budget)
or the messages of a finished ascent on another problem built from the same cost table
(the same model tied, or this one with more strategies allowed). Output: whether the
snapshot is laid out like this ascent's, or the messages each end here takes.

Why: the solve runs many ascents on related problems (the untied copy of a tied model,
the modes the branching restricts to); any messages give a valid bound, and those of a
related problem start an ascent near its end, so it needs few sweeps.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from autoplan.ilp.bound.dual_layout import End
from autoplan.ilp.formulation.problem import Problem

__all__ = ["seed_messages", "warm_fits"]


def warm_fits(mine: tuple, theirs: tuple) -> bool:
    """Whether snapshot ``theirs`` is of a problem laid out as ``mine``'s."""
    _, theta, msgs = mine
    _, theta2, msgs2 = theirs
    return (
        theta.shape == theta2.shape
        and len(msgs) == len(msgs2)
        and all(
            a.shape == c.shape and b.shape == d.shape
            for (a, b), (c, d) in zip(msgs, msgs2, strict=True)
        )
    )


def seed_messages(
    p: Problem,
    pairs: list[tuple[End, End]],
    a: list[np.ndarray],
    b: list[np.ndarray],
    other: Problem,
) -> Iterator[tuple[str, End, np.ndarray]]:
    """The message each end of ``p``'s edges (``pairs``) takes from the messages ``a`` and
    ``b`` of an ascent on ``other``, with the class it is at: (class, end, per compact
    group). Each edge here takes the messages of the edge there that stands for its first
    cost-table edge (or is this one, for a restriction), read through a strategy of each
    of its groups and split over the edges that edge stands for; an edge folded away there
    takes none."""
    shared = {id(e): k for k, e in enumerate(other.edges)}  # a restriction's own edges
    edge_of = {j: k for k, e in enumerate(other.edges) for j in e.sources}
    for mine, e in enumerate(p.edges):
        k = shared.get(id(e))
        if k is None and e.sources:
            k = edge_of.get(e.sources[0])
        if k is None:
            continue  # folded away there: no messages to take
        theirs = other.edges[k]
        scale = 1.0 if theirs is e else len(e.sources) / len(theirs.sources)
        for end in pairs[mine]:
            full = a[k] if end.axis == 0 else b[k]
            group = theirs.src_group if end.axis == 0 else theirs.dst_group
            at = group[end.order[end.starts]]  # there, the group of one strategy of each
            c = np.where(at >= 0, full[np.maximum(at, 0)], 0.0) * scale
            c = np.where(np.isfinite(c), c, 0.0)
            yield (e.src if end.axis == 0 else e.dst), end, c
