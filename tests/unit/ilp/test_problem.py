"""The class problem: tied edges keep their cost table's matrix, priced as scaled copies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.bound.dual import ascend
from autoplan.ilp.bound.incumbent import cost_of
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.formulation.matrix import emit
from autoplan.ilp.formulation.problem import Problem, build_problem, simplify
from autoplan.ilp.formulation.prune import prune_dominated
from tests.helpers.ilp_problems import budget_between, tie_layers


def _twin_layers(seed: int, layers: int = 4) -> CostTable:
    """a_l -> b_l -> a_(l+1), every layer's edges sharing one random matrix per kind
    (some moves impossible), a memory amount per strategy of a_l."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 6))

    def matrix() -> np.ndarray:
        m = rng.uniform(0.0, 10.0, (n, n))
        m[rng.random((n, n)) < 0.2] = np.inf
        np.fill_diagonal(m, rng.uniform(0.0, 1.0, n))  # a plan always exists
        return m

    inner, outer = matrix(), matrix()
    compute, memory, edges = {}, {}, []
    for k in range(layers):
        a, b = f"a{k}", f"b{k}"
        if k == 0:
            compute[a], compute[b] = rng.uniform(0.0, 5.0, n), rng.uniform(0.0, 5.0, n)
            memory[a] = rng.uniform(1.0, 9.0, n)
        else:  # twins of layer 0
            compute[a], compute[b], memory[a] = compute["a0"], compute["b0"], memory["a0"]
        edges.append(EdgeCost(a, 0, b, 0, np.arange(n), np.arange(n), inner))
        if k + 1 < layers:
            edges.append(EdgeCost(b, 0, f"a{k + 1}", 0, np.arange(n), np.arange(n), outer))
    return CostTable(compute=compute, edges=tuple(edges), memory=memory)


def _copied(p: Problem) -> Problem:
    """``p`` with each edge's prices in a matrix of its own at scale 1: the layout of a
    scaled copy per class edge."""
    edges = [replace(e, cost=e.prices().copy(), scale=1.0) for e in p.edges]
    return Problem(dict(p.linear), dict(p.memory), edges, dict(p.rep), p.budget, dict(p.blocks))


@pytest.mark.parametrize("seed", range(12))
def test_tied_edges_share_the_tables_matrix_and_price_as_scaled_copies(seed):
    """A class edge standing for several tied edges keeps their matrix (no copy) and
    their number as its scale; simplifying, pruning, the solver's arrays, the dual
    ascent and a plan's price then equal those of scaled copies, to the bit (the
    compaction, which reads the shared matrix, merges no row here that only the
    rounding of a scaled copy makes equal)."""
    costs = _twin_layers(seed)
    p = build_problem(costs, tie=tie_layers(costs), memory_budget_bytes=budget_between(costs, 0.4))
    table = {id(e.cost) for e in costs.edges}
    assert all(id(e.cost) in table for e in p.edges)
    assert sorted(e.scale for e in p.edges) == [3.0, 4.0]
    q = _copied(p)
    for x in (p, q):
        simplify(x)
        prune_dominated(x)
    assert p.linear.keys() == q.linear.keys()
    for r in p.linear:
        np.testing.assert_array_equal(p.linear[r], q.linear[r])
    assert [(e.src, e.dst) for e in p.edges] == [(e.src, e.dst) for e in q.edges]
    assert any(e.scale > 1.0 for e in p.edges)  # kept through simplifying and pruning
    for e, f in zip(p.edges, q.edges, strict=True):
        np.testing.assert_array_equal(e.prices(), f.prices())
    a, b = emit(p).matrix, emit(q).matrix
    for field in ("cost", "row_lower", "row_upper", "start", "index", "value"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert ascend(p).bound == ascend(q).bound
    choice = {r: int(np.argmin(c)) for r, c in p.linear.items()}
    assert cost_of(p, choice) == cost_of(q, choice)


def test_rows_equal_only_once_scaled_are_merged_as_a_scaled_copy_merges_them():
    """Two rows one float apart whose prices times 3 round to the same are one row of a
    class edge standing for three tied edges, as they are in a copy scaled by 3; its
    matrix stays unscaled, the first row's."""
    x = 6.732655185893089
    near = float(np.nextafter(x, np.inf))
    assert near != x and near * 3.0 == x * 3.0
    shared = np.array([[x, 1.0, 5.0], [near, 1.0, 5.0], [2.0, 7.0, 0.5]])
    compute = {f"{v}{k}": np.array([1.0, 2.0, 3.0]) for v in "ab" for k in range(3)}
    edges = tuple(
        EdgeCost(f"a{k}", 0, f"b{k}", 0, np.arange(3), np.arange(3), shared) for k in range(3)
    )
    costs = CostTable(compute=compute, edges=edges, memory={})
    p = build_problem(costs, tie={v: v[0] + "0" for v in compute})
    q = _copied(p)
    for x_ in (p, q):
        simplify(x_)
    (e,), (f,) = p.edges, q.edges
    assert e.scale == 3.0 and e.cost.shape == (2, 3) == f.cost.shape
    np.testing.assert_array_equal(e.src_group, [0, 0, 1])
    np.testing.assert_array_equal(e.src_group, f.src_group)
    np.testing.assert_array_equal(e.prices(), f.prices())
    np.testing.assert_array_equal(e.cost[0], shared[0])


def test_edges_with_equal_prices_share_one_matrix_and_the_ilp_is_the_same():
    """Two edges of equal prices made apart (not tied: their ends differ) hold one matrix
    once built; another shape's stays its own; the emitted matrix is the same as without
    the sharing, to the bit."""
    rng = np.random.default_rng(3)
    prices = rng.uniform(0, 5, (3, 3))
    ident = np.arange(3)
    compute = {v: rng.uniform(1, 5, 3) for v in "abcde"}
    edges = (
        EdgeCost("a", 0, "b", 0, ident, ident, prices.copy()),
        EdgeCost("c", 0, "d", 0, ident, ident, prices.copy()),
        EdgeCost("b", 0, "e", 0, np.array([0, 1, 1]), ident, rng.uniform(0, 5, (2, 3))),
    )
    costs = CostTable(compute=compute, edges=edges, memory={})
    model = build_ilp(costs, prune=False)
    by_pair = {(e.src, e.dst): e.cost for e in model.reduced.edges}
    assert by_pair["a", "b"] is by_pair["c", "d"]
    assert by_pair["b", "e"] is not by_pair["a", "b"]
    apart = build_problem(costs)
    simplify(apart)
    want, got = emit(apart).matrix, model.emitted.matrix
    for field in ("cost", "start", "index", "value", "row_lower", "row_upper"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
