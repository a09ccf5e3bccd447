"""Tests for autoplan.cost.routes: cheapest chains of redistributions, checked by brute force
and by running them under LocalTensorMode."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode

import autoplan
from autoplan.core.placements import Placements, fmt, parse
from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import LocalTensorMode, Partial, Replicate, redistribute
from autoplan.cost import router as routes_module
from autoplan.cost.closure import closure, route_arcs
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.lazy_routes import LazyNetwork
from autoplan.cost.mode_routes import ModeRoutes
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.router import Router
from autoplan.cost.routes import Network, canonical
from autoplan.runtime.execute import collective_counts, flatten_mesh_groups
from autoplan.tools.runfile import load_topology
from tests.helpers.execution import placed


def _random_direct(seed: int, n: int, free: float = 0.2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = rng.choice([1.0, 2.0, 3.0, 5.0, 8.0], (n, n))
    d[rng.random((n, n)) < free] = 0.0
    d[rng.random((n, n)) < 0.3] = math.inf
    np.fill_diagonal(d, 0.0)
    return d


def _brute_dist(direct: np.ndarray) -> np.ndarray:
    n = len(direct)
    best = np.full((n, n), math.inf)
    for a, b in itertools.product(range(n), repeat=2):
        others = [k for k in range(n) if k not in (a, b)]
        for size in range(len(others) + 1):
            for mid in itertools.permutations(others, size):
                path = [a, *mid, b] if a != b else [a]
                price = sum(direct[x, y] for x, y in itertools.pairwise(path))
                best[a, b] = min(best[a, b], price)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_closure_is_the_brute_force_cheapest_route_and_routes_follow_it(seed):
    """Floyd-Warshall prices equal the cheapest of all simple paths; each route sums to its
    price and has the fewest moves of any cheapest route (a direct move that is as cheap as
    a detour is taken), with or without the direct moves kept; over the needed moves alone
    (no ``one_move``), the fewest of those."""
    direct = _random_direct(seed, 5)
    dist = closure(direct)
    np.testing.assert_array_equal(dist, _brute_dist(direct))
    arcs = route_arcs(direct, dist)
    arc_src, arc_dst = np.nonzero(arcs)
    one_move = np.isfinite(direct) & (direct <= dist) & ~np.eye(5, dtype=bool)
    full = Network(tuple(range(5)), dist, arc_src, arc_dst, direct[arc_src, arc_dst], one_move)
    lean = Network(tuple(range(5)), dist, arc_src, arc_dst, direct[arc_src, arc_dst])
    for a, b in itertools.product(range(5), repeat=2):
        if not math.isfinite(dist[a, b]):
            with pytest.raises(ValueError, match="no route"):
                full.route(a, b)
            continue
        for net, moves in ((full, direct), (lean, np.where(arcs, direct, math.inf))):
            path = net.route(a, b)
            assert path[0] == a and path[-1] == b
            assert sum(moves[x, y] for x, y in itertools.pairwise(path)) == dist[a, b]
            assert len(path) - 1 == _fewest_moves(moves, a, b, dist[a, b])


def _fewest_moves(direct: np.ndarray, a: int, b: int, price: float) -> int:
    """Brute force: the fewest moves of a simple path from a to b costing ``price``."""
    n = len(direct)
    if a == b:
        return 0
    others = [k for k in range(n) if k not in (a, b)]
    for size in range(len(others) + 1):
        for mid in itertools.permutations(others, size):
            path = [a, *mid, b]
            if sum(direct[x, y] for x, y in itertools.pairwise(path)) == price:
                return size + 1
    raise AssertionError("no path at that price")


@pytest.mark.parametrize("seed", range(8))
def test_kept_moves_reproduce_every_cheapest_price(seed):
    """Routing over route_arcs' moves alone gives the same prices, free moves and cycles included."""
    direct = _random_direct(seed, 7, free=0.35)
    dist = closure(direct)
    arcs = route_arcs(direct, dist)
    only = np.where(arcs, direct, math.inf)
    np.testing.assert_array_equal(closure(only), dist)
    assert arcs.sum() <= np.isfinite(direct).sum() - len(direct)


@pytest.mark.parametrize("seed", range(6))
def test_a_network_per_mode_prices_as_the_closure_of_its_own_moves(seed):
    """ModeRoutes (auto's network per checkpointing mode) computes its distances from the
    one network's when asked: they equal Floyd-Warshall over its own arcs, and pruning to
    sources and sinks and routing agree with a plain Network holding that matrix."""
    direct = _random_direct(seed, 6, free=0.3)
    dist = closure(direct)
    arc_src, arc_dst = np.nonzero(route_arcs(direct, dist))
    base = Network(tuple(range(6)), dist, arc_src, arc_dst, direct[arc_src, arc_dst])
    moded = ModeRoutes(base, (1.0, 2.0, 2.0))
    size = moded.size
    own = np.full((size, size), math.inf)
    np.fill_diagonal(own, 0.0)
    own[moded.arc_src, moded.arc_dst] = moded.arc_cost
    full = closure(own)
    np.testing.assert_array_equal(moded.distances(None, None), full)
    rows, cols = np.array([0, 3, 9, 20]), np.array([7, 13, 20, 23])
    np.testing.assert_array_equal(moded.distances(rows, cols), full[np.ix_(rows, cols)])
    dense = Network(moded.states, full, moded.arc_src, moded.arc_dst, moded.arc_cost)
    for sources, sinks in (([0, 2], [8, 14, 21]), ([6, 12, 19], [7, 13, 20])):
        kept, plain = (
            moded.between(np.array(sources), np.array(sinks)),
            dense.between(np.array(sources), np.array(sinks)),
        )
        assert isinstance(kept, ModeRoutes)
        np.testing.assert_array_equal(kept.arc_src, plain.arc_src)
        np.testing.assert_array_equal(kept.arc_dst, plain.arc_dst)
        again, plain = (
            kept.between(np.array(sources[:1]), np.array(sinks[1:])),
            plain.between(np.array(sources[:1]), np.array(sinks[1:])),
        )
        np.testing.assert_array_equal(again.arc_src, plain.arc_src)
        np.testing.assert_array_equal(again.arc_cost, plain.arc_cost)
    for a, b in itertools.product([0, 1, 7, 14], [8, 15, 22, 3]):
        if not math.isfinite(full[a, b]):
            with pytest.raises(ValueError, match="no route"):
                moded.route(a, b)
            continue
        path = moded.route(a, b)
        assert path == dense.route(a, b)
        assert sum(own[x, y] for x, y in itertools.pairwise(path)) == full[a, b]


def _least_by_matrix(dist, rows, cols, scales, minus, plus, axis):
    """The least route prices the matrix way: every pair, then the least per state."""
    m = dist[np.ix_(rows, cols)]
    for scale in scales:
        m = m * scale
    if axis == 0:
        return np.minimum.reduce(m - minus[:, None] + plus[:, None], axis=0)
    return np.minimum.reduce(m - minus[None, :] + plus[None, :], axis=1)


@pytest.mark.parametrize("seed", range(4))
def test_least_route_prices_equal_the_matrix_ones(seed):
    """Per state, the least over an edge's rows (or columns) of the route price plus an
    offset: a dense network and a moded one over it the same to the last bit; a lazy
    network and a moded one over it, by one search from an added state, to the float
    sums; a head whose offset is the least (an added move of price 0) counts; a NaN
    offset spreads to every state, as in the matrix."""
    rng = np.random.default_rng(seed)
    n = 7
    direct = _random_direct(seed, n, free=0.3)
    dist = closure(direct)
    arc_src, arc_dst = np.nonzero(np.isfinite(direct) & ~np.eye(n, dtype=bool))
    dense = Network(tuple(range(n)), dist, arc_src, arc_dst, direct[arc_src, arc_dst])
    lazy = LazyNetwork.of(tuple(range(n)), arc_src, arc_dst, direct[arc_src, arc_dst])
    for net, exact in ((dense, True), (lazy, False)):
        for moded in (False, True):
            routes = ModeRoutes(net, (1.0, 2.0)) if moded else net
            full = routes.distances(None, None)
            size = routes.size
            for k in (1, 5):
                heads = rng.choice(size, k)
                states = rng.choice(size, 6, replace=False)
                minus, plus = rng.normal(0, 3, k), rng.normal(0, 3, k)
                if k > 1:
                    plus[0] = math.inf  # a group no strategy reaches
                for axis, args in ((0, (heads, states)), (1, (states, heads))):
                    got = routes.least(heads, states, (2.0, 0.5), minus, plus, forward=axis == 0)
                    want = _least_by_matrix(full, *args, (2.0, 0.5), minus, plus, axis)
                    if exact:
                        np.testing.assert_array_equal(got, want)
                    else:
                        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
            nan = np.array([math.inf, 0.0])
            with np.errstate(invalid="ignore"):  # inf - inf, as dual_prices allows
                got = routes.least(
                    np.array([0, 1]), np.arange(size), (1.0,), nan, nan, forward=True
                )
            assert np.isnan(got).all()


def _router(mesh_shape, topology=None) -> Router:
    topo = topology or Topology()
    return Router(EdgePricer(RedistributeModel(mesh_shape, CollectiveModel(topo))))


def test_70b_mesh_gathers_across_nodes_through_a_local_slice():
    """On 8x8x8 H100s, S(0)S(2)R -> S(0)RR is cheaper sliced on cp first, then gathered fused."""
    router = _router((8, 8, 8), load_topology("h100"))
    src, dst = parse("S(0)S(2)R", 3), parse("S(0)RR", 3)
    edge = router.edge([src], [dst], (64, 8192, 8192), 4)
    direct = router.pricer.matrix([src], [dst], (64, 8192, 8192), 4)[0, 0]
    path = edge.net.route(int(edge.row_state[0]), int(edge.col_state[0]))
    assert [fmt(edge.net.states[k]) for k in path] == ["S(0)S(2)R", "S(0)S(2)S(2)", "S(0)RR"]
    assert edge.cost[0, 0] < direct / 5  # 6.5 ms against 43.9 ms


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 2, 2), (8, 8, 8)])
def test_route_prices_never_exceed_one_move_and_the_moves_reproduce_them(mesh_shape):
    """Every route price is at most DTensor's one-step price, and the network's moves give it."""
    router = _router(mesh_shape, load_topology("h100"))
    states = canonical((16, 64, 128), mesh_shape)
    edge = router.edge(states, states, (16, 64, 128), 2)
    direct = router.pricer.matrix(states, states, (16, 64, 128), 2)
    assert (edge.cost <= direct).all()
    net = edge.net
    only = np.full((net.size, net.size), math.inf)
    only[net.arc_src, net.arc_dst] = net.arc_cost
    np.testing.assert_allclose(closure(only), net.dist, rtol=1e-12)
    assert len(net.arc_src) < np.isfinite(net.dist).sum()


def test_routes_run_hop_by_hop_with_the_collectives_priced_per_hop():
    """Each multi-move route on a 2x2x2 mesh, run one redistribution per hop, gives the tensor
    back unchanged and runs exactly the collectives priced for its hops."""
    shape, mesh_shape = (8, 8), (2, 2, 2)
    router = _router(mesh_shape)
    model = router.pricer.redist
    # Partial ends are left out: LocalTensorMode's R -> P start is no sum of rank values
    states = [p for p in canonical(shape, mesh_shape) if not any(isinstance(x, Partial) for x in p)]
    edge = router.edge(states, states, shape, 4)
    net = edge.net
    pairs = [
        (a, b)
        for a, b in itertools.product(edge.row_state, edge.col_state)
        if math.isfinite(net.dist[a, b]) and len(net.route(a, b)) > 2
    ]
    assert len(pairs) > 50
    mesh = autoplan.fake_mesh(mesh_shape, ("a", "b", "c"))
    x = torch.arange(64.0).reshape(shape)
    bad = []
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        for a, b in random.Random(0).sample(pairs, 60):
            path = [net.states[k] for k in net.route(a, b)]
            value = placed(x, mesh, path[0])
            with CommDebugMode() as comm:
                for hop in path[1:]:
                    value = redistribute(value, mesh, hop)
            priced = Counter(
                kind
                for s, d in itertools.pairwise(path)
                for kind, *_ in model.steps(s, d, shape, 4)
            )
            executed = collective_counts(comm.get_comm_counts())
            if executed != dict(priced) or not torch.equal(value.full_tensor(), x):
                bad.append(f"{' -> '.join(map(fmt, path))}: ran {executed}, priced {dict(priced)}")
    assert not bad, bad[:5]


def test_waypoints_leave_out_uneven_splits_but_keep_the_edges_own():
    """A dim of 2 on an 8-way axis is no waypoint; an edge that shards it still gets its price."""
    states = canonical((64, 2), (8,))
    assert [fmt(p) for p in states] == ["R", "P", "S(0)"]
    router = _router((8,))
    odd = parse("S(1)", 1)
    edge = router.edge([odd], [parse("R", 1)], (64, 2), 4)
    assert edge.cost[0, 0] == router.pricer.matrix([odd], [parse("R", 1)], (64, 2), 4)[0, 0]


def test_replicated_detour_reaches_a_partial_dtensor_cannot_make_in_one_move():
    """S(0) -> P is no DTensor move, but S(0) -> R -> P is: the route prices it as the gather."""
    router = _router((2,))
    s0, r, p = parse("S(0)", 1), (Replicate(),), (Partial(),)
    direct = router.pricer.matrix([s0], [p], (8, 8), 4)[0, 0]
    edge = router.edge([s0], [p], (8, 8), 4)
    gather = router.pricer.matrix([s0], [r], (8, 8), 4)[0, 0]
    assert math.isinf(direct)
    assert edge.cost[0, 0] == gather


def test_routes_never_make_a_plan_dearer_and_the_plan_lists_them():
    """MLP on (tp across two nodes, cp inside one): the routed plan is cheaper than DTensor's
    one-move plan, and its routes survive the JSON round trip."""
    from autoplan.models.mlp import TinyMLP
    from autoplan.result.plan import Plan
    from autoplan.trace.capture import mean_loss

    topology = dataclasses.replace(load_topology("h100"), gpus_per_node=2)
    with torch.device("meta"):
        model = TinyMLP()

    def plan(routes: bool) -> Plan:
        return autoplan.plan(
            model,
            lambda: torch.randn(16, 32, 64),
            autoplan.fake_mesh((2, 2), ("tp", "cp")),
            config=autoplan.PlanConfig(topology=topology, routes=routes, solver="highs"),
            input_placements=["S(0)R"],
            loss_fn=mean_loss,  # the mean's reduction is what the cross-node route saves on
        )

    routed, direct = plan(True), plan(False)
    assert routed.objective_us < direct.objective_us
    assert routed.routes and not direct.routes
    for (node, slot), hops in routed.routes.items():
        assert node in routed.node_placements and 0 <= slot < len(
            routed.node_placements[node].inputs
        )
        assert hops and all(len(h) == 2 and parse(fmt(h), 2) == h for h in hops)
    assert Plan.from_json(routed.to_json()).routes == routed.routes
    assert f"routed moves: {len(routed.routes)} inputs" in routed.summary()
    assert "routed moves" not in direct.summary()


def test_free_cycle_agrees_with_networkx_on_random_price_matrices():
    """Zero-price moves form a cycle exactly when networkx finds their graph cyclic."""
    import networkx as nx

    from autoplan.cost.closure import _free_cycle

    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(500):
        n = int(rng.integers(1, 10))
        direct = np.where(rng.random((n, n)) < rng.uniform(0, 0.35), 0.0, 1.0 + rng.random((n, n)))
        direct[rng.random((n, n)) < 0.2] = np.inf
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((i, j) for i, j in zip(*np.nonzero(direct == 0.0), strict=True) if i != j)
        want = not nx.is_directed_acyclic_graph(g)
        assert _free_cycle(direct) == want
        seen.add(want)
    assert seen == {True, False}


@pytest.mark.parametrize("seed", range(4))
def test_closure_equals_networkx_floyd_warshall(seed):
    """closure gives networkx's floyd_warshall_numpy prices, free and impossible moves included."""
    import networkx as nx

    direct = _random_direct(seed, 60)
    g = nx.DiGraph()
    g.add_nodes_from(range(60))
    src, dst = np.nonzero(np.isfinite(direct) & ~np.eye(60, dtype=bool))
    g.add_weighted_edges_from(
        zip(src.tolist(), dst.tolist(), direct[src, dst].tolist(), strict=True)
    )
    np.testing.assert_array_equal(closure(direct), nx.floyd_warshall_numpy(g, nodelist=range(60)))


@pytest.mark.parametrize("threaded", [0, 10**9])
def test_edges_of_one_shape_share_one_network_built_alike_on_threads_or_not(monkeypatch, threaded):
    """Router.precompute builds one network per shape and element size holding every edge's
    placements, the same closed on worker threads or in the caller's thread and in any
    edge order, and no move costs more on it than on the edge's own network."""
    shape = (16, 3, 128)  # 3 splits unevenly: S(1) on any axis is no waypoint, only an edge's own
    states = canonical(shape, (2, 2, 2))
    own = [parse("S(1)RR", 3), parse("RS(1)R", 3), parse("RRS(1)", 3)]
    edges = [
        (states[:40], states[20:70], shape, 4),
        (own[:1] + states[:5], states[3:30], shape, 4),
        (states[60:], own[1:], shape, 4),
        (states[60:], own[::-1], shape, 2),
        (states[:40], states[20:70], shape, 4),  # asked twice: built once
    ]
    monkeypatch.setattr(routes_module, "_THREADED", threaded)
    ahead = _router((2, 2, 2))
    ahead.precompute(edges)
    monkeypatch.setattr(routes_module, "_THREADED", 10**9 - threaded)
    reverse = _router((2, 2, 2))
    reverse.precompute(edges[::-1])
    assert len(ahead._nets) == 2
    for rows, cols, shape, dtype_bytes in edges:
        got = ahead.edge(rows, cols, shape, dtype_bytes)
        other = reverse.edge(rows, cols, shape, dtype_bytes)
        alone = _router((2, 2, 2)).edge(rows, cols, shape, dtype_bytes)
        # the routers number placements in the order they meet them: compare by placement
        order = [other.net.states.index(p) for p in got.net.states]
        assert sorted(order) == list(range(other.net.size))
        np.testing.assert_array_equal(got.net.dist, other.net.dist[np.ix_(order, order)])
        assert _moves(got.net) == _moves(other.net)
        np.testing.assert_array_equal(got.cost, other.cost)
        assert (got.cost <= alone.cost).all()
        if dtype_bytes == 4:  # every S(1) placement of the three fp32 edges, on each network
            assert set(own) <= set(got.net.states)


def _moves(net: Network) -> set[tuple[Placements, Placements, float]]:
    return {
        (net.states[a], net.states[b], float(c))
        for a, b, c in zip(net.arc_src, net.arc_dst, net.arc_cost, strict=True)
    }


def _first_found_tree(a: int, n: int, moves: list[tuple[int, int, float]], dist_a: np.ndarray):
    """A plain breadth-first search from ``a`` over the tight moves (``moves`` by source
    state, then ascending), a state's parent the first state to reach it."""
    parent = [-1] * n
    parent[a] = a
    frontier = [a]
    while frontier:
        found = []
        for u in frontier:
            for x, v, price in moves:
                tight = dist_a[u] + price <= dist_a[v] * (1 + 1e-9) + 1e-9
                if x == u and math.isfinite(dist_a[v]) and tight and parent[v] < 0:
                    parent[v] = u
                    found.append(v)
        frontier = found
    return parent


@pytest.mark.parametrize("seed", range(6))
def test_the_tree_of_routes_is_the_first_found_one_on_dense_and_lazy_networks(seed):
    """Many equal-priced routes (prices of a few values, free moves): the tree of routes
    out of every state is the one a plain search finds taking moves in order, on a
    network with every one-move route, one with the needed moves alone, and a lazy one
    over the same moves with their own prices."""
    n = 12
    direct = _random_direct(seed, n, free=0.3)
    dist = closure(direct)
    arcs = route_arcs(direct, dist)
    arc_src, arc_dst = np.nonzero(arcs)
    one_move = np.isfinite(direct) & (direct <= dist) & ~np.eye(n, dtype=bool)
    states = tuple(range(n))
    full = Network(states, dist, arc_src, arc_dst, direct[arc_src, arc_dst], one_move)
    lean = Network(states, dist, arc_src, arc_dst, direct[arc_src, arc_dst])
    order = np.random.default_rng(seed).permutation(len(arc_src))  # arcs in any order
    lazy = LazyNetwork.of(states, arc_src[order], arc_dst[order], direct[arc_src, arc_dst][order])
    for net, mask, prices in ((full, one_move, dist), (lean, arcs, dist), (lazy, arcs, direct)):
        moves = [
            (int(u), int(v), float(prices[u, v])) for u, v in zip(*np.nonzero(mask), strict=True)
        ]
        for a in range(n):
            dist_a = net.distances(np.array([a]), None)[0]
            assert net.tree(a).tolist() == _first_found_tree(a, n, moves, dist_a)
