"""The exact ILP reductions (pruning, folding, reduced-cost fixing) keep the optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import autoplan
from autoplan.cost.price import CostTable, EdgeCost
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.formulation.problem import build_problem, simplify
from autoplan.ilp.formulation.prune import prune_dominated
from autoplan.ilp.solver.solve import solve
from tests.helpers.brute_force import brute_force, combos, dominated_rows, footprint
from tests.helpers.ilp_problems import SEEDS, moded_problem, random_costs

APPROX = {"rel": 1e-6, "abs": 1e-6}


def _edge(src: str, dst: str, rows: list[int], cols: list[int], cost) -> EdgeCost:
    return EdgeCost(src, 0, dst, 0, np.array(rows), np.array(cols), np.array(cost, dtype=float))


def _dominated_pair() -> CostTable:
    """a's strategy 1 beats strategy 0 (cheaper, same moves); b has a real choice."""
    edge = _edge("a", "b", [0, 0, 1], [0, 1], [[0.0, 4.0], [3.0, 0.0]])
    return CostTable(
        compute={"a": np.array([5.0, 1.0, 2.0]), "b": np.array([0.0, 1.0])},
        edges=(edge,),
        memory={},
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_every_reduction_matches_brute_force(seed):
    """With a memory budget and gradient edges, plain and reduced solves equal brute force."""
    costs = random_costs(seed, grad_edges=True, memory=True)
    footprints = sorted({footprint(costs, c) for c in combos(costs)})
    budget = footprints[len(footprints) // 2]
    best = brute_force(costs, budget=budget)
    for prune in (False, True):
        try:
            model = build_ilp(costs, memory_budget_bytes=budget, prune=prune)
        except ValueError:
            assert not np.isfinite(best)
            continue
        for fixing in (False, True):
            sol = solve(model, fixing=fixing)
            if not np.isfinite(best):
                assert sol.status == "infeasible"
                continue
            assert sol.status == "optimal"
            assert sol.objective_us == pytest.approx(best, **APPROX), (prune, fixing)
            assert footprint(costs, sol.choice) <= budget


def test_pruning_reaches_a_fixpoint_and_removes_on_random_cases():
    """A second pruning pass finds nothing; across the random cases something is pruned."""
    removed = 0
    for seed in SEEDS:
        p = build_problem(random_costs(seed, grad_edges=True))
        try:
            simplify(p)
        except ValueError:
            continue
        removed += prune_dominated(p)
        assert prune_dominated(p) == 0
    assert removed > 0


def test_dominated_strategy_is_removed():
    """A strategy that is dearer and moves alike is pruned; the optimum is unchanged."""
    costs = _dominated_pair()
    model = build_ilp(costs)
    assert model.stats["pruned"] >= 1
    assert not model.allowed["a"][0]
    assert solve(model).objective_us == pytest.approx(brute_force(costs), **APPROX)


def test_pinned_strategy_survives_pruning():
    """A node pinned to a dominated strategy keeps it, and the plan uses it."""
    costs = _dominated_pair()
    allowed = {"a": np.array([True, False, False])}
    model = build_ilp(costs, allowed=allowed)
    assert model.allowed["a"].tolist() == [True, False, False]
    sol = solve(model)
    assert sol.choice["a"] == 0
    assert sol.objective_us == pytest.approx(brute_force(costs, allowed=allowed), **APPROX)


def test_constrained_choice_loses_strategies_only_to_allowed_ones():
    """With strategy 1 forbidden, strategy 0 is not pruned in its favour."""
    costs = _dominated_pair()
    allowed = {"a": np.array([True, False, True])}
    model = build_ilp(costs, allowed=allowed)
    assert model.allowed["a"][0] or model.allowed["a"][2]
    assert not model.allowed["a"][1]
    sol = solve(model)
    assert sol.objective_us == pytest.approx(brute_force(costs, allowed=allowed), **APPROX)


def test_memory_counts_only_under_a_budget():
    """A faster strategy that needs more memory is pruned only when no budget is set."""
    costs = CostTable(
        compute={"p": np.array([1.0, 2.0]), "q": np.array([0.0, 1.0])},
        edges=(_edge("p", "q", [0, 0], [0, 1], [[0.0, 1.0]]),),
        memory={"p": np.array([100.0, 10.0])},
    )
    assert build_ilp(costs).allowed["p"].tolist() == [True, False]
    model = build_ilp(costs, memory_budget_bytes=50.0)
    assert model.allowed["p"].tolist() == [True, True]
    assert solve(model).choice["p"] == 1


def test_real_mlp_is_pruned_and_keeps_its_optimum(meta_mlp):
    """On a memory-tight MLP on 2x2, every reduction on gives the plain ILP's objective."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    plans = {}
    for on in (True, False):
        config = autoplan.PlanConfig(
            memory_budget_gib=0.0004,
            cluster_layers=on,
            prune_dominated=on,
            reduced_cost_fixing=on,
        )
        plans[on] = autoplan.plan(meta_mlp, lambda: torch.randn(32, 64), mesh, config=config)
    assert plans[True].status == plans[False].status == "optimal"
    assert plans[True].ilp_size["pruned"] > 0
    assert plans[True].ilp_size["variables"] < plans[False].ilp_size["variables"]
    assert plans[True].objective_us == pytest.approx(plans[False].objective_us, rel=1e-3)


@pytest.mark.parametrize("seed", range(10))
def test_two_pass_dominance_equals_comparing_every_pair_on_every_column(seed):
    """The dedupe-probe-confirm dominance check drops exactly the rows the full comparison drops."""
    from autoplan.ilp.formulation.prune import dominated

    rng = np.random.default_rng(seed)
    f = rng.choice([0.0, 1.0, 2.0, np.inf], (40, 100), p=[0.4, 0.3, 0.2, 0.1])
    f[5] = f[3]  # equal rows: the first stays
    f[11] = f[12] = f[30]  # one row three times: 12 and 30 go, 11 only if beaten
    f[7] = np.minimum(f[8], f[9])  # a row that beats others
    expected = dominated_rows(f)
    np.testing.assert_array_equal(dominated(f, probe=8, chunk=16), expected)
    assert expected.any()


@pytest.mark.parametrize("seed", range(4))
def test_dominance_with_hundreds_of_distinct_prices_per_column(seed):
    """Columns of more distinct prices than the probe's ranks hold, and rows equal in value
    but not in bytes (0.0 and -0.0): the same rows go as by the full comparison."""
    from autoplan.ilp.formulation.prune import dominated

    rng = np.random.default_rng(seed)
    f = rng.integers(0, 5000, (600, 40)).astype(np.float64)  # ~560 distinct per column
    f[100:150] = f[:50] + rng.integers(0, 3, (50, 40))  # beaten by rows 0-49, or equal
    f[0, 0] = 0.0
    f[200] = f[0]
    f[200, 0] = -0.0  # equal to row 0 in value only: the earlier stays
    f[201, :5] = 0.0
    f[202] = f[201]
    f[202, :5] = -0.0
    expected = dominated_rows(f)
    assert expected[100:150].sum() >= 45 and expected[200] and expected[202]
    assert not expected[0] and not expected[201]
    np.testing.assert_array_equal(dominated(f, probe=16, chunk=64), expected)


@pytest.mark.parametrize("seed", range(4))
def test_dominance_over_spans_of_columns_with_many_witnesses(seed):
    """Rows compared a few columns at a time, and rows beaten by many others (whose pairs
    are skipped once one beats them): the same rows go as by the full comparison."""
    from autoplan.ilp.formulation.prune import dominated

    rng = np.random.default_rng(seed)
    base = rng.choice([0.0, 1.0, 2.0, 4.0, np.inf], (30, 50), p=[0.3, 0.3, 0.2, 0.1, 0.1])
    f = np.vstack([base, base + rng.integers(0, 2, base.shape), base[::-1] + 1.0])
    expected = dominated_rows(f)
    assert expected.sum() >= 30
    np.testing.assert_array_equal(dominated(f, probe=6, chunk=8, span=7), expected)


@pytest.mark.parametrize("seed", range(6))
def test_columns_equal_in_every_row_are_dropped_and_no_other(seed):
    """Columns equal in every row (inf or a price) say nothing about any pair; a column
    equal in all rows but one does, and must stay: the same rows go as by the full
    comparison."""
    from autoplan.ilp.formulation.prune import dominated

    rng = np.random.default_rng(seed)
    f = rng.choice([0.0, 1.0, 2.0], (30, 12), p=[0.5, 0.3, 0.2])
    width = f.shape[1]
    f = np.hstack([f, np.full((30, 6), np.inf), np.full((30, 3), 7.0), np.full((30, 4), 1.0)])
    rows = rng.choice(30, 4, replace=False)
    f[rows, width + 9 :] = 0.0  # nearly constant: one row each, lower than the others
    f[rows, width + 9 + np.arange(4)] = 2.0  # ... and one column each where it is higher
    expected = dominated_rows(f)
    assert expected.any() and not expected.all()
    np.testing.assert_array_equal(dominated(f, probe=6, chunk=8, span=5), expected)


def _brute_dominated(f: np.ndarray) -> np.ndarray:
    """Row j goes when another row is <= it everywhere, the first of equal rows staying."""
    n = len(f)
    out = np.zeros(n, dtype=bool)
    for j in range(n):
        for i in range(n):
            if i != j and (f[i] <= f[j]).all() and (not (f[i] >= f[j]).all() or i < j):
                out[j] = True
    return out


@pytest.mark.parametrize("seed", range(12))
def test_mode_blocks_are_pruned_apart_only_when_no_block_can_dominate_another(seed):
    """dominated_in_blocks equals comparing every pair: on blocks that a block diagonal
    edge keeps apart (checked block by block) and on blocks it does not, each block's
    rows one run (read in place) or spread out."""
    from autoplan.ilp.formulation.prune import dominated_in_blocks

    rng = np.random.default_rng(seed)
    count, width = 3, int(rng.integers(3, 7))
    block = np.repeat(np.arange(count), width)
    f = rng.choice([1.0, 2.0, 3.0], size=(count * width, 4))
    f[rng.random(len(f)) < 0.3] = f[0]  # repeated rows
    diagonal = np.where(block[:, None] == np.arange(count)[None, :], 0.0, np.inf)
    spread = rng.permutation(len(f))
    for apart in (True, False):
        g = np.hstack([f, diagonal]) if apart else f
        np.testing.assert_array_equal(dominated_in_blocks(g, block), _brute_dominated(g))
        g = g[spread]
        np.testing.assert_array_equal(dominated_in_blocks(g, block[spread]), _brute_dominated(g))


@pytest.mark.parametrize("seed", range(12))
def test_a_classs_features_are_its_prices_and_amounts_side_by_side(seed):
    """The pruning's features: per allowed strategy, its linear cost, its memory under a
    budget, then each edge's row (at the source) or column (at the destination) of prices,
    in the incident order; a destination's columns read the same whether the strategies
    are fewer than the columns or not."""
    from autoplan.ilp.formulation.problem import Edge, Problem
    from autoplan.ilp.formulation.prune import _features

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    linear = {"a": rng.uniform(0, 5, n), "b": rng.uniform(0, 5, 3)}
    memory = {"a": rng.choice([1.0, 2.0], n)}
    edges = []
    for k in range(3):
        width = int(rng.integers(1, 2 * n))  # fewer groups than strategies, or more
        group = rng.integers(0, width, n)
        other = rng.integers(0, 2, 3)
        if k % 2:
            cost = rng.uniform(0, 5, (2, width))
            edges.append((Edge("b", "a", other, group, cost, "b -> a"), False))
        else:
            cost = rng.uniform(0, 5, (width, 2))
            edges.append((Edge("a", "b", group, other, cost, "a -> b"), True))
    idx = np.flatnonzero(rng.random(n) < 0.8)
    for budget in (None, 3.0):
        p = Problem(linear, memory, [e for e, _ in edges], {"a": "a", "b": "b"}, budget)
        want = [linear["a"][idx, None]] + ([memory["a"][idx, None]] if budget else [])
        for e, is_src in edges:
            want.append(e.cost[e.src_group[idx]] if is_src else e.cost[:, e.dst_group[idx]].T)
        np.testing.assert_array_equal(_features(p, "a", idx, edges), np.hstack(want))


@pytest.mark.parametrize("seed", range(16))
def test_mode_blocks_judged_a_block_at_a_time_match_the_whole_features(seed):
    """A moded class judged block by block, each block's features built into one buffer,
    drops what comparing every pair of its whole features drops; a class whose blocks no
    edge keeps apart is judged whole."""
    from autoplan.ilp.formulation.problem import Edge, Problem
    from autoplan.ilp.formulation.prune import _apart, _features, _judge

    p = moded_problem(seed)
    rng = np.random.default_rng(seed)
    incident = p.incident()
    apart = whole = 0
    for r in p.blocks:
        idx = np.flatnonzero(rng.random(len(p.linear[r])) < 0.85)
        if len(idx) < 2:
            continue
        want = _brute_dominated(_features(p, r, idx, incident[r]))
        np.testing.assert_array_equal(_judge(p, r, idx, incident[r], None), want)
        found = _apart(p, r, idx, incident[r])
        apart += found is not None
        whole += found is None
    # a moded class whose one edge is dense: no column keeps its blocks apart
    width = 3
    lone = Problem(
        {"a": rng.uniform(0, 5, 2 * width), "b": rng.uniform(0, 5, 2)},
        {},
        [Edge("a", "b", np.arange(2 * width), np.arange(2), rng.uniform(0, 5, (6, 2)), "a -> b")],
        {"a": "a", "b": "b"},
        None,
        {"a": ("layer", width)},
    )
    idx = np.arange(2 * width)
    edges = lone.incident()["a"]
    assert _apart(lone, "a", idx, edges) is None
    want = _brute_dominated(_features(lone, "a", idx, edges))
    np.testing.assert_array_equal(_judge(lone, "a", idx, edges, None), want)
    assert apart and not whole
