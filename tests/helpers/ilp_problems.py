"""Small planning problems to solve exactly: random cost tables and ILP problems, layer stacks.

Every random case is small enough to enumerate (see ``tests.helpers.brute_force``), so
a test can check the solver's optimum exactly, not bound it. A seed picks the case.
"""

from __future__ import annotations

import math

import numpy as np

from autoplan.cost.closure import closure, route_arcs
from autoplan.cost.price import GRAD_SLOT, CostTable, EdgeCost
from autoplan.cost.routes import Network
from autoplan.ilp.formulation.build import IlpModel
from autoplan.ilp.formulation.matrix import emit
from autoplan.ilp.formulation.problem import Edge, Problem
from tests.helpers.brute_force import brute_force

SEEDS = range(30)

# ---------------------------------------------------------------- random cost tables


def _random_edge(
    rng: np.random.Generator, u: str, v: str, slot: int, n_u: int, n_v: int
) -> EdgeCost:
    """A random edge: random placement groups on both sides, ~20% impossible moves."""
    rows, cols = int(rng.integers(1, n_u + 1)), int(rng.integers(1, n_v + 1))
    cost = rng.uniform(0.0, 10.0, size=(rows, cols))
    cost[rng.random((rows, cols)) < 0.1] = 0.0
    cost[rng.random((rows, cols)) < 0.2] = np.inf
    return EdgeCost(
        src=u,
        src_out=0,
        dst=v,
        slot=slot,
        src_group=rng.integers(0, rows, size=n_u),
        dst_group=rng.integers(0, cols, size=n_v),
        cost=cost,
    )


def random_costs(seed: int, *, grad_edges: bool = False, memory: bool = False) -> CostTable:
    """A random DAG of 2..6 nodes with 1..4 strategies each (optionally gradients, memory)."""
    rng = np.random.default_rng(seed)
    names = [f"n{k}" for k in range(int(rng.integers(2, 7)))]
    sizes = {v: int(rng.integers(1, 5)) for v in names}
    compute = {v: rng.uniform(0.0, 20.0, size=sizes[v]) for v in names}
    edges: list[EdgeCost] = []
    for b, v in enumerate(names):
        slot = 0
        for u in names[:b]:
            if rng.random() < 0.5:
                edges.append(_random_edge(rng, u, v, slot, sizes[u], sizes[v]))
                slot += 1
    if grad_edges:
        # a later node's "gradient" flows back to an earlier "parameter"; n0 always gets one
        for a, p in enumerate(names[:-1]):
            if a == 0 or rng.random() < 0.6:
                g = names[int(rng.integers(a + 1, len(names)))]
                edges.append(_random_edge(rng, g, p, GRAD_SLOT, sizes[g], sizes[p]))
    mem: dict[str, np.ndarray] = {}
    if memory:
        params = [v for v in names if rng.random() < 0.6] or names[:1]
        mem = {p: rng.integers(1, 100, size=sizes[p]).astype(np.float64) for p in params}
    return CostTable(compute=compute, edges=tuple(edges), memory=mem)


FEASIBLE_MEMORY_SEEDS = [
    s for s in SEEDS if math.isfinite(brute_force(random_costs(s, memory=True)))
][:10]


# ---------------------------------------------------------------- random ILP problems


def random_problem(seed: int) -> Problem:
    """Classes of 1-3 strategies (some impossible), edges with impossible moves, a budget.

    Not simplified: lone-strategy classes keep their edges, so the emitter must move
    their constant indicator to the right-hand side.
    """
    rng = np.random.default_rng(seed)
    names = [f"n{k}" for k in range(int(rng.integers(3, 6)))]
    linear, memory = {}, {}
    for v in names:
        cost = rng.uniform(0.0, 10.0, int(rng.integers(1, 4)))
        if len(cost) > 1 and rng.random() < 0.3:
            cost[int(rng.integers(len(cost)))] = math.inf
        linear[v] = cost
        if rng.random() < 0.5:
            memory[v] = rng.choice([10.0, 20.0, 40.0], len(cost))
    edges = []
    for _ in range(int(rng.integers(2, 6))):
        a, b = rng.choice(len(names), 2, replace=False)
        u, v = names[a], names[b]
        src_group = rng.integers(0, 2, len(linear[u]))
        dst_group = rng.integers(0, 2, len(linear[v]))
        cost = rng.uniform(0.0, 5.0, (int(src_group.max()) + 1, int(dst_group.max()) + 1))
        cost[rng.random(cost.shape) < 0.15] = math.inf
        edges.append(Edge(u, v, src_group, dst_group, cost, f"{u} -> {v}"))
    budget = float(sum(m.max() for m in memory.values()) * 0.7) if memory else None
    return Problem(linear, memory, edges, {v: v for v in names}, budget)


def ilp_model(p: Problem) -> IlpModel:
    """``p`` emitted as is (not simplified), every finite-cost strategy allowed."""
    return IlpModel(emit(p), p, {v: np.isfinite(c) for v, c in p.linear.items()})


def routed_problem(seed: int) -> Problem:
    """Random problems whose edges are route-priced: cost = a network's cheapest-route prices.

    Classes of 1-4 strategies, each its own row or column; lone-strategy ends included.
    Some edges stand for 2 or 3 tied ones: their prices are the shared network's, scaled.
    """
    rng = np.random.default_rng(1000 + seed)
    names = [f"n{k}" for k in range(int(rng.integers(3, 6)))]
    linear = {v: rng.uniform(0.0, 10.0, int(rng.integers(1, 5))) for v in names}
    memory = {v: rng.choice([10.0, 20.0, 40.0], len(linear[v])) for v in names[:2]}
    edges = []
    for _ in range(int(rng.integers(2, 6))):
        a, b = rng.choice(len(names), 2, replace=False)
        u, v = names[a], names[b]
        n = int(rng.integers(3, 6))
        direct = rng.choice([0.0, 1.0, 2.0, 3.0, 5.0], (n, n))
        direct[rng.random((n, n)) < 0.25] = math.inf
        dist = closure(direct)
        arc_src, arc_dst = np.nonzero(route_arcs(direct, dist))
        net = Network(tuple(range(n)), dist, arc_src, arc_dst, direct[arc_src, arc_dst])
        row_state = rng.choice(n, len(linear[u]))
        col_state = rng.choice(n, len(linear[v]))
        scale = float(rng.choice([1, 2, 3]))
        edges.append(
            Edge(
                u,
                v,
                np.arange(len(linear[u])),
                np.arange(len(linear[v])),
                dist[np.ix_(row_state, col_state)],
                f"{u} -> {v}",
                net=net,
                row_state=row_state,
                col_state=col_state,
                scale=scale,
            )  # fmt: skip
        )
    budget = float(sum(m.max() for m in memory.values()) * 0.7)
    return Problem(linear, memory, edges, {v: v for v in names}, budget)


def moded_problem(seed: int) -> Problem:
    """Layer groups of two or three classes whose strategies come in the same 2 or 3
    mode blocks (``Problem.blocks``), joined by block-diagonal edges (no move between two
    modes, so a group's classes agree on theirs), dense edges between groups and to a
    class outside them, and a budget between the smallest and largest footprint, so that
    the LP mixes modes. Small enough to enumerate."""
    rng = np.random.default_rng(seed)
    modes = int(rng.integers(2, 4))
    sizes = [2, 2] if rng.random() < 0.5 else [3]
    linear, memory, blocks, groups = {}, {}, {}, []
    for g, size in enumerate(sizes):
        members = [f"g{g}n{k}" for k in range(size)]
        groups.append(members)
        for v in members:
            width = int(rng.integers(1, 3))
            # a mode that keeps more is faster and takes more memory
            speed = np.repeat(np.arange(modes)[::-1] * 2.0, width)
            linear[v] = rng.uniform(0.0, 4.0, modes * width) + speed
            memory[v] = rng.uniform(5.0, 10.0, modes * width) + np.repeat(
                np.arange(modes) * 8.0, width
            )
            blocks[v] = (f"layer{g}", width)
    linear["out"] = rng.uniform(0.0, 10.0, 2)
    edges = []

    def width(v: str) -> int:
        return blocks[v][1] if v in blocks else len(linear[v])

    for members in groups:
        for u, v in zip(members, members[1:], strict=False):
            a, b = width(u), width(v)
            cost = np.full((modes * a, modes * b), math.inf)
            for k in range(modes):
                cost[k * a : (k + 1) * a, k * b : (k + 1) * b] = rng.uniform(0.0, 3.0, (a, b))
            n, m = cost.shape
            edges.append(Edge(u, v, np.arange(n), np.arange(m), cost, f"{u} -> {v}"))
    ends = [members[-1] for members in groups] + ["out"]
    for u, v in zip(ends, ends[1:], strict=False):
        n, m = len(linear[u]), len(linear[v])
        edges.append(
            Edge(u, v, np.arange(n), np.arange(m), rng.uniform(0.0, 3.0, (n, m)), f"{u} -> {v}")
        )
    low = sum(float(mem.min()) for mem in memory.values())
    high = sum(float(mem.max()) for mem in memory.values())
    budget = low + (high - low) * float(rng.uniform(0.2, 0.6))
    return Problem(linear, memory, edges, {v: v for v in linear}, budget, blocks)


# ---------------------------------------------------------------- stacks of identical layers


def layer_stack(num_layers: int, seed: int, *, coupled: bool) -> CostTable:
    """x -> (w_l -> mm_l) x layers -> out: identical layers, each with a weight whose fast
    placements take more memory than its slow ones; ``coupled=False`` makes the moves
    between layers free, so only the budget ties them together."""
    rng = np.random.default_rng(seed)
    n = 3
    c_mm, c_w = rng.uniform(1, 5, n), rng.uniform(0, 1, n)
    mem = np.sort(rng.uniform(1, 10, n))[::-1]  # strategy 0 biggest ...
    w_mm = np.add.outer(np.sort(rng.uniform(0, 6, n)), np.zeros(n))  # ... and cheapest to use
    hh = rng.uniform(0, 3, (n, n)) if coupled else np.zeros((n, n))
    ident = np.arange(n)
    compute, memory, edges = {"x": rng.uniform(1, 5, n)}, {}, []
    prev = "x"
    for layer in range(num_layers):
        w, mm = f"w{layer}", f"mm{layer}"
        compute[w], compute[mm] = c_w.copy(), c_mm.copy()
        memory[w] = mem.copy()
        edges.append(EdgeCost(w, 0, mm, 0, ident, ident, w_mm))
        edges.append(EdgeCost(prev, 0, mm, 1, ident, ident, hh))
        prev = mm
    compute["out"] = rng.uniform(1, 5, n)
    edges.append(EdgeCost(prev, 0, "out", 0, ident, ident, hh))
    return CostTable(compute=compute, edges=tuple(edges), memory=memory)


def tie_layers(costs: CostTable) -> dict[str, str]:
    """Every layer's nodes tied to layer 0's (the ends too: what the tie gives away is untied)."""
    return {v: v[:-1] + "0" if v[-1].isdigit() else v for v in costs.compute}


def budget_between(costs: CostTable, share: float) -> float:
    """The budget ``share`` of the way from the smallest footprint to the largest."""
    low = sum(float(m.min()) for m in costs.memory.values())
    high = sum(float(m.max()) for m in costs.memory.values())
    return low + (high - low) * share
