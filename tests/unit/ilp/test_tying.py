"""Tying the variables of repeated identical layers."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.reductions.tying import cluster
from autoplan.ilp.solver.solve import solve


def _chain(num_layers: int, seed: int = 0) -> CostTable:
    """embed -> (a_l -> b_l) x num_layers -> head, identical prices in every layer."""
    rng = np.random.default_rng(seed)
    ca, cb = rng.uniform(1, 5, 3), rng.uniform(1, 5, 3)
    ab, ba = rng.uniform(0, 4, (3, 3)), rng.uniform(0, 4, (3, 3))
    ident = np.arange(3)
    compute = {"embed": rng.uniform(1, 5, 3)}
    edges = []
    prev = "embed"
    for layer in range(num_layers):
        a, b = f"a{layer}", f"b{layer}"
        compute[a], compute[b] = ca.copy(), cb.copy()
        edges.append(EdgeCost(prev, 0, a, 0, ident, ident, ba if layer else ab))
        edges.append(EdgeCost(a, 0, b, 0, ident, ident, ab))
        prev = b
    compute["head"] = rng.uniform(1, 5, 3)
    edges.append(EdgeCost(prev, 0, "head", 0, ident, ident, ba))
    return CostTable(compute=compute, edges=tuple(edges), memory={})


def test_interior_layers_are_tied_and_ends_are_not():
    """Middle layers of a long chain share a class; the first and last layers stay apart."""
    rep = cluster(_chain(12), rounds=2).rep
    assert rep["a5"] == rep["a6"] == rep["a4"]
    assert rep["a0"] != rep["a5"] and rep["b11"] != rep["b5"]
    assert rep["a5"] != rep["b5"]


def test_tied_ilp_is_smaller_and_prices_its_choice_exactly():
    """Tying shrinks the ILP; the tied objective is what its choice costs, and never below the untied one."""
    costs = _chain(10)
    free = solve(build_ilp(costs))
    tie = cluster(costs).rep
    model = build_ilp(costs, tie=tie)
    tied = solve(model)
    assert model.num_variables < build_ilp(costs).num_variables
    assert tied.status == "optimal"
    priced = sum(costs.compute[v][i] for v, i in tied.choice.items()) + sum(
        e.cost[e.src_group[tied.choice[e.src]], e.dst_group[tied.choice[e.dst]]]
        for e in costs.edges
    )
    assert tied.objective_us == pytest.approx(priced)
    assert tied.objective_us >= free.objective_us - 1e-9
    for v, r in tie.items():
        assert tied.choice[v] == tied.choice[r]


def test_price_digests_round_in_one_buffer_and_read_their_own_prices():
    """An array's digest is the hash of its prices rounded to TIE_DECIMALS (in C order) and
    its shape, whatever arrays were rounded in the shared buffer before it and whatever its
    own layout: equal prices to that rounding digest alike, others not."""
    from autoplan.ilp.reductions.tying import _digest, _Digests
    from autoplan.ilp.tolerances import TIE_DECIMALS

    rng = np.random.default_rng(0)
    big = rng.integers(0, 10**9, (40, 30)) / 1e6  # prices on the rounding's grid
    big[::3, ::4] = np.inf
    small = big[:5, :6].copy()
    digests = _Digests()
    found = [digests._digest(a) for a in (big, small, big, np.asfortranarray(big), small.T)]
    want = [
        _digest(np.round(a, TIE_DECIMALS).tobytes() + str(a.shape).encode())
        for a in (big, small, big, big, small.T)
    ]
    assert found == want
    assert found[0] == found[2] == found[3] and found[1] != found[4]
    nudged = big + 1e-9  # the same prices to six decimals, far from a rounding's edge
    assert digests._digest(nudged) == found[0]
    assert digests._digest(big + 1e-3) != found[0]
    assert digests._digest(big.reshape(30, 40)) != found[0]  # the shape is hashed too
