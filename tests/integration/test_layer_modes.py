"""activation_checkpointing="auto": each layer's mode as part of its strategies
(autoplan.memory.layer_modes), priced exactly, chosen per layer by the ILP."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import autoplan
from autoplan.core.config import CHECKPOINT_MODES
from autoplan.cost.block_diagonal import BlockDiagonal
from autoplan.ilp.bound.dual import ascend
from autoplan.ilp.bound.incumbent import footprint, priced
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.reductions.followers import collapse_followers
from autoplan.ilp.reductions.tying import cluster
from autoplan.ilp.solver.solve import solve
from autoplan.memory.layer_modes import layer_modes, mode_boundary
from autoplan.memory.recompute import checkpointed, layer_names, recompute_set
from tests.helpers.planning import plan_tiny_llama
from tests.helpers.priced import priced_tiny_llama


def _plan(budget: float, mode: str) -> autoplan.Plan:
    return plan_tiny_llama(
        autoplan.fake_mesh((4,), ("dp",)),
        num_layers=4,
        batch=8,
        seq=32,
        input_placements=["S(0)"],
        config=autoplan.PlanConfig(
            memory_budget_gib=budget, activation_checkpointing=mode, activation_memory=True
        ),
    )


@pytest.mark.slow  # four plans under a binding budget: about two minutes
def test_auto_mixes_modes_across_layers_when_that_is_cheaper():
    """Under a budget no uniform mode meets cheaply, auto recomputes some layers in full
    and keeps the others, within the budget (the backward's transient included), and
    beats every mode taken for all layers."""
    budget = 0.004
    auto = _plan(budget, "auto")
    assert auto.status == "optimal"
    assert {"none", "full"} <= set(auto.checkpointing.values()), auto.checkpointing
    assert auto.memory_bytes + auto.memory_breakdown["transient"] <= budget * 2**30
    for mode in CHECKPOINT_MODES:
        uniform = _plan(budget, mode)
        peak = uniform.memory_bytes + uniform.memory_breakdown.get("transient", 0.0)
        if uniform.status != "infeasible" and peak <= budget * 2**30:  # a plan that fits
            assert auto.objective_us < uniform.objective_us, mode
    full = [n for n in auto.recompute if auto.node_placements[n]["op"] == "aten.einsum.default"]
    assert full  # a full layer's matmuls run again


def test_every_mix_of_layer_modes_is_priced_as_its_recomputation_runs():
    """For one plan's placements under each of several per-layer modes, the mode-expanded
    table's time equals the exact price of that recomputation and its memory row the
    exact kept bytes plus the parameters' state."""
    traced, table, costs, allowed = priced_tiny_llama(3, (2, 2))
    reduction = collapse_followers(table, costs, keep=set(allowed) | mode_boundary(traced))
    space = layer_modes(traced, table, costs, reduction)
    layers = layer_names(traced)
    assert set(space.layers.values()) == set(layers)
    found = solve(build_ilp(space.costs, allowed=space.allowed(allowed), prune=False))
    own, modes = space.split(found.choice)
    assert set(modes.values()) == {"none"}  # no budget: recomputing only adds time
    mixes = [{layer: mode for layer in layers} for mode in CHECKPOINT_MODES]
    mixes += [
        dict(zip(layers, ("full", "none", "selective"), strict=True)),
        dict(zip(layers, ("selective", "full", "none"), strict=True)),
    ]
    for mix in mixes:
        expanded = {
            v: CHECKPOINT_MODES.index(mix[space.layers[v]]) * space.widths[v] + i
            if v in space.widths
            else i
            for v, i in own.items()
        }
        exact, _ = checkpointed(traced, table, costs, recompute_set(traced, mix), counted=True)
        plan = reduction.expand(own)
        assert priced(space.costs.compute, space.costs.edges, expanded) == pytest.approx(
            priced(exact.compute, exact.edges, plan), rel=1e-9
        ), mix
        assert footprint(space.costs.memory, expanded) == pytest.approx(
            footprint(exact.memory, plan), rel=1e-12
        ), mix
        assert space.split(expanded) == (own, mix)


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


def test_twin_layers_share_their_mode_expanded_arrays():
    """The mode space of a 5-layer LLaMA holds one array per layer class for the roots'
    compute and memory and the edges' groups, placements and prices, not one per layer
    (the three inner layers are twins); the prices are checked exactly above."""
    traced, table, costs, allowed = priced_tiny_llama(5, (2, 2))
    reduction = collapse_followers(table, costs, keep=set(allowed) | mode_boundary(traced))
    space = layer_modes(traced, table, costs, reduction)
    roots = [r for r in space.costs.compute if r in space.layers]
    for arrays in (
        [space.costs.compute[r] for r in roots],
        [space.costs.memory[r] for r in roots if r in space.costs.memory],
    ):
        assert len({id(a) for a in arrays}) <= 0.6 * len(arrays), len(arrays)
    moded = [e for e in space.costs.edges if e.dst in space.layers and e.dst_placements]
    for field in ("dst_group", "dst_placements", "cost"):
        found = [getattr(e, field) for e in moded]
        assert len({id(x) for x in found}) <= 0.6 * len(found), field


@pytest.mark.parametrize("budget_share", [None, 0.6])
def test_block_diagonal_edges_build_the_ilp_their_dense_matrices_build(budget_share):
    """The mode table's edges within a layer kept as blocks, through simplifying, pruning,
    tying and sharing, lay out the same ILP as the same edges made dense, and its dual
    ascent reaches the same bound."""
    traced, table, costs, allowed = priced_tiny_llama(3, (2, 2))
    reduction = collapse_followers(table, costs, keep=set(allowed) | mode_boundary(traced))
    space = layer_modes(traced, table, costs, reduction)
    blocked = [e for e in space.costs.edges if isinstance(e.cost, BlockDiagonal)]
    assert blocked
    dense = replace(
        space.costs,
        edges=tuple(replace(e, cost=np.asarray(e.cost)) for e in space.costs.edges),
    )
    budget = None
    if budget_share is not None:  # between the least and the most a plan may keep
        least = footprint(
            space.costs.memory, {v: int(np.argmin(m)) for v, m in space.costs.memory.items()}
        )
        most = footprint(
            space.costs.memory, {v: int(np.argmax(m)) for v, m in space.costs.memory.items()}
        )
        budget = least + budget_share * (most - least)
    models = []
    for table_ in (space.costs, dense):
        tie = cluster(table_).rep
        models.append(
            build_ilp(table_, allowed=space.allowed(allowed), memory_budget_bytes=budget, tie=tie)
        )
    kept, whole = models
    assert any(isinstance(e.cost, BlockDiagonal) for e in kept.reduced.edges)
    for field in ("cost", "upper", "integer", "row_lower", "row_upper", "start", "index", "value"):
        np.testing.assert_array_equal(
            getattr(kept.emitted.matrix, field), getattr(whole.emitted.matrix, field), field
        )
    assert ascend(kept.reduced).bound == pytest.approx(ascend(whole.reduced).bound, rel=1e-12)
