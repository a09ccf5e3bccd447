"""activation_checkpointing="auto": each layer's mode as part of its strategies
(autoplan.memory.layer_modes), priced exactly, chosen per layer by the ILP."""

from __future__ import annotations

import numpy as np

from autoplan.ilp.bound.incumbent import priced
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.reductions.followers import collapse_followers
from autoplan.ilp.solver.solve import solve
from autoplan.memory.layer_modes import layer_modes, mode_boundary
from tests.helpers.priced import priced_tiny_llama


def test_a_layer_takes_one_mode_even_where_its_prices_would_split_it():
    """Choices that give one layer's nodes two modes are impossible (an infinite price):
    the links and block diagonal edges join every root of a layer."""
    traced, table, costs, allowed = priced_tiny_llama(2, (2, 2))
    reduction = collapse_followers(table, costs, keep=set(allowed) | mode_boundary(traced))
    space = layer_modes(traced, table, costs, reduction)
    found = solve(build_ilp(space.costs, allowed=space.allowed(allowed), prune=False))
    layer = next(iter(set(space.layers.values())))
    roots = [v for v, lay in space.layers.items() if lay == layer]
    for r in roots[1:]:
        split = dict(found.choice)
        split[r] = found.choice[r] % space.widths[r] + 2 * space.widths[r]  # full, alone
        assert not np.isfinite(priced(space.costs.compute, space.costs.edges, split)), r


def test_a_route_priced_edge_stays_a_flow_whose_routes_cost_its_prices():
    """An edge into a recomputed node keeps its route network, one copy per mode: the
    network's distances between the edge's states are its mode-expanded prices, so the
    ILP's flow prices it as the pairs would."""
    traced, table, costs, allowed = priced_tiny_llama(2, (2, 2), routes=True)
    reduction = collapse_followers(table, costs, keep=set(allowed) | mode_boundary(traced))
    space = layer_modes(traced, table, costs, reduction)
    moded = [e for e in space.costs.edges if e.net is not None and e.net.size > len(e.col_state)]
    assert moded
    for e in space.costs.edges:
        if e.net is not None:
            assert e.row_state is not None and e.col_state is not None
            np.testing.assert_allclose(e.net.distances(e.row_state, e.col_state), e.cost)
