"""Stage 5c (bound), dual prices: what a dual bound says per column, and the plan it points to.

Input: a reduced :class:`~autoplan.ilp.formulation.problem.Problem`, its emitted matrix and a
:class:`~autoplan.ilp.bound.dual.Dual`. Output: per column a price ``d_j >= 0`` such
that every plan using column j costs at least the bound plus ``d_j``
(:func:`column_reduced_costs`), and a plan decoded from the potentials
(:func:`decode`).

Why: the MIP (5e) leaves out every column priced above the incumbent's gap
(:mod:`autoplan.ilp.solver.solve`), and the LP of :mod:`autoplan.ilp.bound.relax` runs over
the columns priced near zero. The prices are min-marginals of the dual's
potentials, which rule out more columns than the LP's own reduced costs although
the dual bound sits slightly below the LP's (``python scripts/relax_vs_lp.py CONFIG``
compares the two).
"""

from __future__ import annotations

import numpy as np

from autoplan.ilp.bound.dual import Dual
from autoplan.ilp.formulation.matrix import Emitted, Flow
from autoplan.ilp.formulation.problem import Problem

__all__ = ["column_reduced_costs", "decode"]


def column_reduced_costs(p: Problem, em: Emitted, dual: Dual) -> np.ndarray:
    """Per column of ``em``'s matrix, a d_j >= 0 such that every plan whose solution
    uses column j costs at least ``dual.bound + d_j``.

    A strategy column takes its class's reduced cost. A pair column (g, h) of edge e
    adds to φ_e(g, h) - min φ_e the cheapest reduced cost of the strategies in each
    group, less the part of it that e itself contributed. A flow arc x -> y lies on a
    route from g's state to h's of price at least dist(g, x) + w + dist(y, h), so its
    d_j is that route's least excess over the same terms.
    """
    d = np.zeros(em.matrix.num_cols)
    with np.errstate(invalid="ignore"):  # inf - inf on groups no strategy can reach
        _fill(p, em, dual, d)
    return np.where(np.isnan(d), 0.0, np.maximum(d, 0.0))  # nan: keep the column


def _fill(p: Problem, em: Emitted, dual: Dual, d: np.ndarray) -> None:
    for r, class_cols in em.class_cols.items():
        sel = class_cols >= 0
        d[class_cols[sel]] = dual.reduced[r][sel]
    for k, e in enumerate(p.edges):
        phi, low = dual.phi[k], dual.low[k]
        side = []
        for cls, group, axis in ((e.src, e.src_group, 0), (e.dst, e.dst_group, 1)):
            size = phi.shape[axis]
            red = np.full(size, np.inf)
            ok = group >= 0
            np.minimum.at(red, group[ok], dual.reduced[cls][ok])
            own = dual.margin[k][axis]
            side.append(np.where(np.isfinite(red), red - own, np.inf))
        u, v = side
        cols = em.edge_cols[k]
        if isinstance(cols, Flow):
            net = cols.net
            # the cheapest way into each state an arc leaves and out of each it enters,
            # then per arc by its ends' states: a network has far fewer states than
            # moves, and its arcs touch only some of them
            starts, start_of = np.unique(net.arc_src, return_inverse=True)
            ends, end_of = np.unique(net.arc_dst, return_inverse=True)
            scale = (cols.scale,)
            into = net.least(cols.row_state, starts, scale, dual.a[k], u, forward=True)
            out = net.least(cols.col_state, ends, scale, dual.b[k], v, forward=False)
            arc = into[start_of] + net.arc_cost * cols.scale
            arc = arc + out[end_of] - low
            d[cols.first_col + np.arange(len(arc))] = arc
        else:
            sel = cols >= 0
            pair = phi.full() - low + u[:, None] + v[None, :]
            d[cols[sel]] = pair[sel]


def decode(p: Problem, dual: Dual) -> dict[str, int]:
    """A plan read off the potentials: the classes in order, each taking its cheapest
    strategy given the classes decided before it (their rows of the shared edges) and
    the cheapest completion of the rest (the edges' row minima). It may exceed the
    budget: :func:`~autoplan.ilp.bound.incumbent.from_plan` repairs it."""
    ends: dict[str, list[tuple[int, bool]]] = {r: [] for r in p.linear}
    for k, e in enumerate(p.edges):
        ends[e.src].append((k, True))
        ends[e.dst].append((k, False))
    choice: dict[str, int] = {}
    for r in p.linear:
        score = dual.theta[r].copy()
        for k, is_src in ends[r]:
            e, phi = p.edges[k], dual.phi[k]
            other = e.dst if is_src else e.src
            if other in choice:
                at = int((e.dst_group if is_src else e.src_group)[choice[other]])
                vec = phi.column(at) if is_src else phi.row(at)
            else:
                vec = phi.row_min if is_src else phi.col_min
            group = e.src_group if is_src else e.dst_group
            score = score + np.where(group >= 0, vec[np.maximum(group, 0)], np.inf)
        choice[r] = int(np.argmin(score))
    return choice
