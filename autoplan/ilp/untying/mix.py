"""Stage 5d (untying), mix: an untied plan that takes the tied LP's strategies layer by layer.

Input: the node-level cost table, the tied model (its classes, copies and memory
budget) and the tied LP relaxation's values (:func:`~autoplan.ilp.bound.relax.relax`).
Output: a strategy per node that meets the budget, and its exact cost; or None.

Why: under a binding memory budget the tied LP relaxation is a mix. In every
class it leaves fractional it splits the same way, between a fast plan that
overflows the budget and a lean one that fits. An untied plan can take the fast
plan in some layers and the lean one in the others, which is what the untie step
(:mod:`autoplan.ilp.untying.untie`) looks for. Its MIP is slow to find that mix: the
copies are interchangeable, so branch and bound meets each mix many times over; this
module finds it directly.

How: the nodes of fractional classes with several copies, joined by the edges
between them, fall into components: one per layer and a few lone nodes. A
fractional class with one copy (a node every layer reads) keeps its heaviest
LP strategy, as does every other node. A component's options are the
combinations of its classes' LP strategies (or, past :data:`_MAX_OPTIONS`, the
first, second, ... of each), priced exactly with the rest held; components
share no edge, so a plan's cost is the sum of its components' options. That
is a multiple-choice knapsack, solved greedily on each component's lower
convex hull of (memory, time): every component starts at its leanest option,
then hull steps are taken by time saved per byte while the budget allows.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from autoplan.core.components import components
from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.bound.incumbent import footprint, priced
from autoplan.ilp.bound.relax import Relaxation
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.tolerances import LP_USED

# Past this many combinations a component's options are its classes' k-th LP strategies.
_MAX_OPTIONS = 256

# One option of a component: (memory bytes, microseconds, a strategy per member node).
Option = tuple[float, float, tuple[int, ...]]


def mix_layers(
    costs: CostTable, model: IlpModel, relaxed: Relaxation
) -> tuple[dict[str, int], float] | None:
    """The knapsack mix of the module docstring: (strategy per node, cost), or None when
    there is no budget, no LP values, or even the leanest mix does not fit."""
    p = model.reduced
    values = relaxed.lp_values
    if p.budget is None or not values or relaxed.choice is None:
        return None
    support: dict[str, list[int]] = {}
    for r, c in p.linear.items():
        v = values.get(r)
        if v is None:
            support[r] = [relaxed.choice[r]]
            continue
        v = np.where(np.isfinite(c), v, -1.0)
        used = [int(i) for i in np.argsort(-v, kind="stable") if v[i] > LP_USED]
        support[r] = used or [relaxed.choice[r]]
    copies = Counter(p.rep.values())
    choice = {v: support[r][0] for v, r in p.rep.items()}
    # a class whose strategies come in blocks (layer modes) mixes with its whole group
    free = {v for v, r in p.rep.items() if len(support[r]) > 1 and (copies[r] > 1 or r in p.blocks)}
    group_of = {v: costs.blocks[v][0] for v in free if v in costs.blocks}
    hulls = []
    for members, edges in _components(costs, free, group_of):
        blocks = [costs.blocks.get(v) for v in members]
        supports = [support[p.rep[v]] for v in members]
        hulls.append(
            (members, lower_hull(_block_options(costs, members, supports, blocks, choice, edges)))
        )
    if not all(hull for _, hull in hulls):
        return None  # a component with no possible option of the LP's strategies
    for members, hull in hulls:
        choice.update(zip(members, hull[0][2], strict=True))
    room = p.budget - footprint(costs.memory, choice)
    if room < 0:
        return None
    steps = sorted(
        ((hull[j][1] - hull[j - 1][1]) / (hull[j][0] - hull[j - 1][0]), k, j)
        for k, (_, hull) in enumerate(hulls)
        for j in range(1, len(hull))
    )
    level = [0] * len(hulls)
    for _, k, j in steps:
        hull = hulls[k][1]
        grow = hull[j][0] - hull[j - 1][0]
        if level[k] == j - 1 and grow <= room:
            room -= grow
            level[k] = j
    for (members, hull), j in zip(hulls, level, strict=True):
        choice.update(zip(members, hull[j][2], strict=True))
    cost = priced(costs.compute, costs.edges, choice)
    return (choice, cost) if np.isfinite(cost) else None


def _components(
    costs: CostTable, free: set[str], group_of: dict[str, str]
) -> list[tuple[list[str], list[EdgeCost]]]:
    """The nodes of ``free`` joined by edges between them, but for edges between two
    groups of ``group_of``, and each group joined; each with its incident edges (one
    layer's mode is one choice, and the layers' modes are mixed like their placements)."""
    touching: dict[str, list[EdgeCost]] = defaultdict(list)
    pairs: list[tuple[str, str]] = []
    for e in costs.edges:
        ends = (group_of.get(e.src), group_of.get(e.dst))
        apart = None not in ends and ends[0] != ends[1]
        if e.src in free and e.dst in free and not apart:
            pairs.append((e.src, e.dst))
        for v in {e.src, e.dst} & free:
            touching[v].append(e)
    first: dict[str, str] = {}
    pairs += [(v, first.setdefault(group, v)) for v, group in group_of.items()]
    members: dict[str, list[str]] = defaultdict(list)
    for v, head in components(sorted(free), pairs).items():
        members[head].append(v)
    out = []
    for group in members.values():
        group.sort()
        edges = {id(e): e for v in group for e in touching[v]}
        out.append((group, list(edges.values())))
    out.sort(key=lambda c: c[0][0])
    return out


def _block_options(
    costs: CostTable,
    members: list[str],
    supports: list[list[int]],
    blocks: list[tuple[str, int] | None],
    held: dict[str, int],
    edges: list[EdgeCost],
) -> list[Option]:
    """:func:`_options`, once per block where the members' strategies come in blocks: a
    member in blocks takes its strategies of that block only."""
    count = max(
        (len(costs.compute[v]) // b[1] for v, b in zip(members, blocks, strict=True) if b),
        default=0,
    )
    if not count:
        return _options(costs, members, supports, held, edges)
    out = []
    for k in range(count):
        within = [
            s if b is None else [i for i in s if i // b[1] == k]
            for s, b in zip(supports, blocks, strict=True)
        ]
        if all(within):
            out += _options(costs, members, within, held, edges)
    return out


def _options(
    costs: CostTable,
    members: list[str],
    supports: Sequence[list[int]],
    held: dict[str, int],
    edges: list[EdgeCost],
) -> list[Option]:
    """Each option of one component, priced with every other node at ``held``."""
    width = max(len(s) for s in supports)
    if np.prod([len(s) for s in supports], dtype=float) <= _MAX_OPTIONS:
        combos: list[tuple[int, ...]] = list(itertools.product(*supports))
    else:
        combos = [tuple(s[min(k, len(s) - 1)] for s in supports) for k in range(width)]
    out = []
    for combo in combos:
        pick = dict(zip(members, combo, strict=True))
        time = sum(float(costs.compute[v][i]) for v, i in pick.items())
        for e in edges:
            i, j = pick.get(e.src, held[e.src]), pick.get(e.dst, held[e.dst])
            time += float(e.cost[e.src_group[i], e.dst_group[j]])
        mem = sum(float(costs.memory[v][i]) for v, i in pick.items() if v in costs.memory)
        if np.isfinite(time):  # an impossible move, or layer modes that disagree
            out.append((mem, time, combo))
    return out


def lower_hull(options: list[Option]) -> list[Option]:
    """The lower convex hull of (memory, time), leanest first: each later option needs
    more memory for less time, at a falling saving per byte."""
    hull: list[Option] = []
    for o in sorted(options, key=lambda o: (o[0], o[1])):
        if hull and o[1] >= hull[-1][1]:
            continue  # more memory and no faster
        while len(hull) >= 2:
            (m0, t0, _), (m1, t1, _) = hull[-2], hull[-1]
            if (t1 - t0) * (o[0] - m0) >= (o[1] - t0) * (m1 - m0):
                hull.pop()  # the step to hull[-1] saves no more per byte than going straight on
            else:
                break
        hull.append(o)
    return hull
