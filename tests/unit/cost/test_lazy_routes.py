"""Lazy route networks on 4-D meshes: the near moves keep every route price of the full
network (autoplan.cost.near_moves, autoplan.cost.lazy_routes, autoplan.cost.router)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import autoplan
from autoplan.core.placements import parse
from autoplan.core.topology import Topology
from autoplan.cost import router as router_module
from autoplan.cost.closure import closure
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.lazy_routes import LazyNetwork, _beaten
from autoplan.cost.near_moves import near_pairs
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.router import Router
from autoplan.cost.routes import canonical, canonical_axes
from autoplan.tools.runfile import load_topology

MESH = (2, 2, 2, 2)


def _pricer(mesh_shape=MESH) -> EdgePricer:
    return EdgePricer(RedistributeModel(mesh_shape, CollectiveModel(load_topology("h100"))))


def _near_moves(shape=(8, 16)):
    """The states of ``shape`` on MESH, its near moves and their prices."""
    states = canonical(shape, MESH)
    pricer = _pricer()
    ids = np.array(pricer.ids(states))
    src, dst = near_pairs(canonical_axes(shape, MESH))
    return tuple(states), src, dst, pricer.pair_prices(ids[src], ids[dst], shape, 2)


@pytest.mark.parametrize(
    ("shape", "mesh_shape"),
    [((8, 16), MESH), ((4, 8, 2), MESH), ((16, 8, 4), MESH), ((8, 8), (2, 4, 2, 2))],
)
def test_near_moves_keep_every_route_price_of_the_full_network(shape, mesh_shape):
    """The cheapest routes over the near moves cost, pair by pair, what the routes over
    every direct move cost (the dense network's Floyd-Warshall), with a few of the moves
    priced; a lazy network's prices are those."""
    states = canonical(shape, mesh_shape)
    pricer = _pricer(mesh_shape)
    ids = np.array(pricer.ids(states))
    full = closure(pricer.matrix_of_ids(tuple(ids), tuple(ids), shape, 2))
    src, dst = near_pairs(canonical_axes(shape, mesh_shape))
    assert len(set(zip(src.tolist(), dst.tolist(), strict=True))) == len(src)  # each once
    assert len(src) < 0.5 * len(states) ** 2
    net = LazyNetwork.of(tuple(states), src, dst, pricer.pair_prices(ids[src], ids[dst], shape, 2))
    np.testing.assert_allclose(net.distances(None, None), full, rtol=1e-12)


def test_a_lazy_network_narrowed_between_states_keeps_their_route_prices():
    """``between`` keeps, of a lazy network's moves, only ones on a cheapest route from a
    source to a sink: searched again over those alone, every such pair costs what it
    costs over every move, and far fewer moves are left."""
    states, src, dst, cost = _near_moves()
    net = LazyNetwork.of(states, src, dst, cost)
    rng = np.random.default_rng(0)
    sources = rng.choice(len(states), 40, replace=False)
    sinks = rng.choice(len(states), 30, replace=False)
    narrowed = net.between(sources, sinks)
    assert 0 < len(narrowed.arc_src) < len(net.arc_src) / 4
    alone = LazyNetwork.of(states, narrowed.arc_src, narrowed.arc_dst, narrowed.arc_cost)
    np.testing.assert_allclose(
        alone.distances(sources, sinks), net.distances(sources, sinks), rtol=1e-12
    )


def test_distances_read_kept_searches_before_running_new_ones():
    """The narrowing searches toward the sinks when they are fewer than the sources, and
    an edge's prices from some sources to those sinks are read off those searches (no
    search from the sources), equal to the prices a fresh network finds from them."""
    states, src, dst, cost = _near_moves()
    net = LazyNetwork.of(states, src, dst, cost)
    rng = np.random.default_rng(1)
    sources = rng.choice(len(states), 50, replace=False)
    sinks = rng.choice(len(states), 5, replace=False)
    narrowed = net.between(sources, sinks)
    assert narrowed.prices.searched_to(sinks)
    rows = sources[:20]
    found = narrowed.distances(rows, sinks)
    assert not narrowed.prices.searched_from(rows)  # read toward the sinks
    fresh = LazyNetwork.of(states, src, dst, cost)
    from_rows = fresh.prices.from_states(rows)[:, sinks]
    np.testing.assert_allclose(found, from_rows, rtol=1e-12)


def test_a_network_narrowed_toward_its_sinks_keeps_every_pair_a_cheapest_route():
    """Narrowed from the sources (more sinks) or toward the sinks (fewer), every pair's
    price over the moves kept is its price over every move."""
    states, src, dst, cost = _near_moves()
    rng = np.random.default_rng(2)
    many = rng.choice(len(states), 60, replace=False)
    few = rng.choice(len(states), 6, replace=False)
    for sources, sinks in ((few, many), (many, few)):
        net = LazyNetwork.of(states, src, dst, cost)
        narrowed = net.between(sources, sinks)
        assert narrowed.prices.searched_from(few) != narrowed.prices.searched_to(few)
        alone = LazyNetwork.of(states, narrowed.arc_src, narrowed.arc_dst, narrowed.arc_cost)
        np.testing.assert_allclose(
            alone.distances(sources, sinks), net.distances(sources, sinks), rtol=1e-12
        )


def test_pair_prices_are_the_matrix_prices_bit_for_bit():
    states = canonical((8, 16), MESH)
    pricer = _pricer()
    ids = np.array(pricer.ids(states))
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, len(ids), 500), rng.integers(0, len(ids), 500)
    matrix = pricer.matrix_of_ids(tuple(ids), tuple(ids), (8, 16), 2)
    assert np.array_equal(pricer.pair_prices(ids[src], ids[dst], (8, 16), 2), matrix[src, dst])


def test_a_4d_router_builds_lazy_networks_that_price_as_the_dense_ones(monkeypatch):
    """An edge with placements of its own (a strided shard, no waypoint) on a 4-D mesh:
    the lazy network's route prices equal the dense network's, and each route it walks
    runs moves whose own prices add up to the route's."""
    shape = (8, 16)
    rows = [parse(p, 4) for p in ("S(0)RRR", "PPRR", "_S(0,2)S(0)RR", "S(1)S(1)PP")]
    cols = [parse(p, 4) for p in ("RRRR", "S(0)S(1)RR", "RS(0)S(0)R", "S(1)RS(0)P")]
    lazy = Router(_pricer()).edge(rows, cols, shape, 2)
    assert isinstance(lazy.net, LazyNetwork)
    monkeypatch.setattr(router_module, "LAZY_AXES", 5)
    dense = Router(_pricer()).edge(rows, cols, shape, 2)
    assert not isinstance(dense.net, LazyNetwork)
    np.testing.assert_allclose(lazy.cost, dense.cost, rtol=1e-12)
    net = lazy.net
    arc = {(a, b): c for a, b, c in zip(net.arc_src, net.arc_dst, net.arc_cost, strict=True)}
    for (r, a), (c, b) in itertools.product(enumerate(lazy.row_state), enumerate(lazy.col_state)):
        if not math.isfinite(lazy.cost[r, c]):
            continue
        path = net.route(int(a), int(b))
        walked = sum(arc[u, v] for u, v in itertools.pairwise(path))
        assert walked == pytest.approx(lazy.cost[r, c], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("model", ["mlp", pytest.param("llama", marks=pytest.mark.slow)])
def test_a_4d_plan_is_the_same_with_lazy_networks(model, monkeypatch):
    """A model on a 2x2x2x2 mesh, routes on: the lazy networks give the dense networks'
    optimum."""
    from autoplan.models.llama3 import Transformer, tiny
    from autoplan.models.mlp import TinyMLP
    from autoplan.trace.capture import mean_loss

    with torch.device("meta"):
        module = TinyMLP() if model == "mlp" else Transformer(tiny(1))
    example = torch.randn(16, 32, 64) if model == "mlp" else torch.randint(0, 128, (8, 32))

    def objective() -> float:
        return autoplan.plan(
            module,
            lambda: example,
            autoplan.fake_mesh(MESH, ("a", "b", "c", "d")),
            config=autoplan.PlanConfig(topology=Topology(), solver="highs"),
            input_placements=["S(0)RRR"],
            loss_fn=mean_loss,
        ).estimated_step_us

    lazy = objective()
    monkeypatch.setattr(router_module, "LAZY_AXES", 5)
    assert lazy == pytest.approx(objective(), rel=1e-9)


def test_a_move_a_route_of_two_beats_is_left_out_and_no_other():
    """States a, b, c, d = 0..3: a->c (3) loses to a->b->c (2); a->d (2) ties a->b->d and
    stays; c->d (5) loses to c->a->d (3), but routes through a, a state of five moves (2 x 3
    against a mean of 2 squared), are not tried."""
    src, dst = np.array([0, 1, 0, 1, 0, 2, 3, 2]), np.array([1, 2, 2, 3, 3, 3, 0, 0])
    cost = np.array([1.0, 1.0, 3.0, 1.0, 2.0, 5.0, 1.0, 1.0])
    beaten = _beaten(4, src, dst, cost)
    assert beaten.tolist() == [False, False, True, False, False, False, False, False]


def test_searches_over_the_trimmed_moves_price_as_those_over_all():
    """Searched from every state at once (the moves a route of two beats left out first)
    or one state at a time (every move), a network's prices are the same."""
    states, src, dst, cost = _near_moves()
    every = np.arange(len(states))
    net = LazyNetwork.of(states, src, dst, cost)
    trimmed = net.prices.from_states(every)
    assert _beaten(len(states), net.arc_src, net.arc_dst, net.arc_cost).sum() > len(src) / 4
    one_by_one = LazyNetwork.of(states, src, dst, cost).prices
    np.testing.assert_array_equal(
        np.stack([one_by_one.from_states(np.array([s]))[0] for s in every]), trimmed
    )
