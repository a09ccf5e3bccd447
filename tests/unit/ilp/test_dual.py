"""Tests for autoplan.ilp.bound.dual: the bound by dual ascent and the column prices it gives."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from autoplan.ilp.backends import run
from autoplan.ilp.bound.dual import Ascent, _Ascent, ascend
from autoplan.ilp.bound.dual_layout import diagonal_blocks
from autoplan.ilp.bound.dual_prices import column_reduced_costs, decode
from autoplan.ilp.bound.incumbent import cost_of, from_plan, memory_of
from autoplan.ilp.bound.relax import _cheapest, relax, start_vector
from autoplan.ilp.formulation.matrix import emit
from autoplan.ilp.formulation.problem import Edge, Problem
from tests.helpers.brute_force import problem_plans
from tests.helpers.ilp_problems import ilp_model, random_problem, routed_problem


def _assert_same_ascent(got: Ascent, want: Ascent, p: Problem) -> None:
    """Two ascents on ``p`` ended in the same bound, multiplier, sweeps and reduced costs,
    to the last bit."""
    a, b = got.result(), want.result()
    assert a.bound == b.bound and a.lam == b.lam and a.sweeps == b.sweeps
    for r in p.linear:
        np.testing.assert_array_equal(a.reduced[r], b.reduced[r])


def _plans(p: Problem) -> list[tuple[dict[str, int], float]]:
    """Every plan that keeps the budget and has a finite cost, with its cost."""
    return [(choice, cost) for choice, cost in problem_plans(p) if math.isfinite(cost)]


def _duals(p: Problem):
    """The dual before any sweep, after raise_bound, refined at a wrong multiplier, and
    started from an ascent on the same problem under twice the budget."""
    fresh = Ascent(p)
    yield fresh.result()
    raised = Ascent(p)
    raised.raise_bound()
    yield raised.result()
    raised.refine(3.0 * raised.result().lam + 1.0)
    yield raised.result()
    if p.budget is not None:
        roomy = Ascent(replace(p, budget=2 * p.budget))
        roomy.raise_bound()
        roomy.refine(roomy.result().lam + 1.0)
        warmed = Ascent(p, warm=roomy.warm())
        assert warmed.warmed
        warmed.raise_bound()
        yield warmed.result()


PROBLEMS = [("pairs", s) for s in range(25)] + [("flows", s) for s in range(25)]


@pytest.mark.parametrize("kind,seed", PROBLEMS)
def test_every_plan_costs_at_least_the_bound_plus_each_of_its_columns_price(kind, seed):
    """Whatever the messages: bound + d_j <= cost for every column j of every plan in budget."""
    p = random_problem(seed) if kind == "pairs" else routed_problem(seed)
    model = ilp_model(p)
    plans = _plans(p)
    for dual in _duals(p):
        dj = column_reduced_costs(p, model.emitted, dual)
        assert (dj >= 0).all()
        for choice, cost in plans:
            assert dual.bound <= cost + 1e-9 * max(1.0, cost)
            for r, i in choice.items():
                assert dual.bound + dual.reduced[r][i] <= cost + 1e-7 * max(1.0, cost)
            used = start_vector(model, choice) > 0
            assert (dual.bound + dj[used] <= cost + 1e-7 * max(1.0, cost)).all()


@pytest.mark.parametrize("kind,seed", PROBLEMS)
def test_bound_is_no_higher_than_the_lp_relaxation(kind, seed):
    """The dual bound never passes the LP's optimum (it is a bound on the LP too)."""
    p = random_problem(seed) if kind == "pairs" else routed_problem(seed)
    em = emit(p)
    if em.infeasible:  # then the matrix leaves out what cannot hold
        return
    m = em.matrix
    lp = run(m, "cbc", mip=False, time_limit_s=None, mip_gap=0.0)
    if lp.status != "optimal":
        return
    lp_bound = float(m.cost @ lp.x) + m.offset
    assert ascend(p).bound <= lp_bound + 1e-7 * max(1.0, abs(lp_bound))


def _chain(costs: list[list[float]], prices: list[np.ndarray]) -> Problem:
    names = [f"n{k}" for k in range(len(costs))]
    linear = {v: np.array(c, dtype=float) for v, c in zip(names, costs, strict=True)}
    edges = [
        Edge(u, v, np.arange(len(linear[u])), np.arange(len(linear[v])), price, f"{u} -> {v}")
        for u, v, price in zip(names, names[1:], prices, strict=False)
    ]
    return Problem(linear, {}, edges, {v: v for v in names}, None)


def test_sweeps_reach_the_optimum_of_a_chain():
    """On a chain (a tree) the LP is tight: the sweeps' bound is the optimum and decodes to it."""
    rng = np.random.default_rng(0)
    sizes = [3, 4, 2, 5, 3]
    p = _chain(
        [list(rng.uniform(0, 10, n)) for n in sizes],
        [rng.uniform(0, 5, (a, b)) for a, b in itertools.pairwise(sizes)],
    )
    best = min(cost for _, cost in _plans(p))
    dual = ascend(p)
    assert dual.bound == pytest.approx(best, rel=1e-6)
    assert cost_of(p, decode(p, dual)) == pytest.approx(best, rel=1e-9)


def test_a_warm_start_from_another_problem_is_not_taken():
    """Messages laid out for another problem are ignored: the ascent starts cold."""
    other = Ascent(random_problem(1))
    other.raise_bound()
    mine = Ascent(random_problem(2), warm=other.warm())
    assert not mine.warmed


def test_memory_multiplier_lifts_the_bound_to_the_lp_under_a_binding_budget():
    """Two weights that cannot both take their fast, big placement: λ > 0, bound = the LP's."""
    p = Problem(
        linear={"w1": np.array([1.0, 5.0]), "w2": np.array([1.0, 4.0]), "x": np.array([0.0, 1.0])},
        memory={"w1": np.array([100.0, 10.0]), "w2": np.array([100.0, 10.0])},
        edges=[
            Edge(
                "w1", "x", np.arange(2), np.arange(2), np.array([[0.0, 2.0], [1.0, 0.0]]), "w1 -> x"
            ),
            Edge(
                "w2", "x", np.arange(2), np.arange(2), np.array([[0.0, 1.0], [3.0, 0.0]]), "w2 -> x"
            ),
        ],  # fmt: skip
        rep={"w1": "w1", "w2": "w2", "x": "x"},
        budget=120.0,
    )
    m = emit(p).matrix
    lp = run(m, "cbc", mip=False, time_limit_s=None, mip_gap=0.0)
    lp_bound = float(m.cost @ lp.x) + m.offset
    dual = ascend(p)
    assert dual.lam > 0
    assert dual.bound > ascend(Problem(p.linear, p.memory, p.edges, p.rep, None)).bound
    assert dual.bound == pytest.approx(lp_bound, rel=1e-3)
    assert dual.bound <= min(cost for _, cost in _plans(p)) + 1e-9


def test_plan_over_the_budget_is_brought_within_it_at_the_least_cost_per_byte():
    """from_plan sheds memory where it costs least per byte saved, then improves the rest."""
    p = Problem(
        linear={"a": np.array([0.0, 10.0, 3.0]), "b": np.array([0.0, 2.0])},
        memory={"a": np.array([100.0, 10.0, 60.0]), "b": np.array([100.0, 10.0])},
        edges=[],
        rep={"a": "a", "b": "b"},
        budget=150.0,
    )
    found = from_plan(p, {"a": 0, "b": 0})
    assert found is not None
    choice, cost = found
    assert memory_of(p, choice) <= 150.0
    assert choice == {"a": 0, "b": 1} and cost == 2.0
    tight = Problem(p.linear, p.memory, [], p.rep, 10.0)  # nothing fits
    assert from_plan(tight, {"a": 0, "b": 0}) is None


def test_relax_bound_and_fixing_keep_the_optimum_on_routed_problems():
    """relax's bound is below the optimum and its kept columns hold an optimal plan."""
    for seed in range(25):
        p = routed_problem(seed)
        plans = _plans(p)
        if not plans:
            continue
        choice, best = min(plans, key=lambda cp: cp[1])
        model = ilp_model(p)
        rel = relax(model)
        assert rel.bound <= best + 1e-9 * max(1.0, best)
        keep = rel.keep()
        if keep is not None:
            used = start_vector(model, choice) > 0
            optimal_kept = any(
                keep[start_vector(model, c) > 0].all()
                for c, cost in plans
                if cost <= best + 1e-9 * max(1.0, best)
            )
            assert optimal_kept, (seed, used)


def test_sweeps_stop_at_the_time_limit_with_a_valid_bound():
    """Out of time the ascent stops sweeping and searching λ, and its bound still holds."""
    p = routed_problem(24)
    free = Ascent(p)
    free.raise_bound()
    ascent = Ascent(p, time_limit_s=0.0)
    ascent.raise_bound()
    assert ascent.sweeps <= 2 < free.sweeps  # one at λ = 0, one at the first λ tried
    dual = ascent.result()
    assert all(dual.bound <= cost + 1e-9 * max(1.0, cost) for _, cost in _plans(p))


def test_knapsack_questions_match_the_per_class_answers():
    """The laid-out memory classes answer 'over budget at λ?' and the bound's λ part as a
    loop over the classes would, ties included (first cheapest strategy)."""
    from autoplan.ilp.bound.memory_price import Knapsack

    rng = np.random.default_rng(0)
    base = [rng.choice([1.0, 2.0, 3.0, np.inf], int(rng.integers(1, 6))) for _ in range(40)]
    for b in base:
        b[0] = 1.0  # every class keeps a finite strategy
    mib = [rng.choice([1.0, 4.0, 9.0], len(b)) for b in base]
    budget = 0.5 * sum(float(m.max()) for m in mib)
    sack = Knapsack(base, mib, budget)
    for lam in (0.0, 0.05, 0.25, 1.0, 3.0):
        used = sum(float(m[np.argmin(b + lam * m)]) for b, m in zip(base, mib, strict=True))
        low = sum(float(np.min(b + lam * m)) for b, m in zip(base, mib, strict=True))
        assert sack.over(lam) == (used > budget)
        assert sack.value(lam) == pytest.approx(low - lam * budget)


def _moded_problem(seed: int) -> Problem:
    """Classes with two mode blocks of strategies, joined by block diagonal edges (no
    move between modes), one class outside the blocks, and a budget."""
    rng = np.random.default_rng(seed)
    names = [f"n{k}" for k in range(4)]
    widths = {v: int(rng.integers(1, 4)) for v in names[:3]}
    linear = {v: rng.uniform(0.0, 10.0, 2 * w) for v, w in widths.items()}
    linear["n3"] = rng.uniform(0.0, 10.0, 2)
    memory = {v: rng.choice([10.0, 20.0, 40.0], 2 * w) for v, w in widths.items()}
    edges = []
    for u, v in (("n0", "n1"), ("n1", "n2"), ("n0", "n2")):
        a, b = widths[u], widths[v]
        cost = np.full((2 * a, 2 * b), math.inf)
        for k in range(2):
            block = rng.uniform(0.0, 5.0, (a, b))
            block[rng.random(block.shape) < 0.15] = math.inf
            cost[k * a : (k + 1) * a, k * b : (k + 1) * b] = block
        edges.append(Edge(u, v, np.arange(2 * a), np.arange(2 * b), cost, f"{u} -> {v}"))
    edges.append(
        Edge("n3", "n2", np.arange(2), np.arange(2 * widths["n2"]),
             rng.uniform(0.0, 5.0, (2, 2 * widths["n2"])), "n3 -> n2")
    )  # fmt: skip
    budget = float(sum(m.max() for m in memory.values()) * 0.8)
    blocks = {v: ("layer", w) for v, w in widths.items()}
    return Problem(linear, memory, edges, {v: v for v in names}, budget, blocks)


def test_diagonal_blocks_keep_only_the_blocks_and_nothing_else():
    inf = math.inf
    square = np.array([[1.0, 2.0, inf, inf], [inf, inf, 5.0, inf]])
    assert diagonal_blocks(square, 2).tolist() == [[[1.0, 2.0]], [[5.0, inf]]]
    assert diagonal_blocks(square[:1], 2).shape == (1, 1, 4)  # one row: no two blocks
    assert diagonal_blocks(square, 1).shape == (1, 2, 4)
    square[1, 0] = 7.0  # a finite price outside the blocks: the matrix stays whole
    assert diagonal_blocks(square, 2).tolist() == [square.tolist()]


@pytest.mark.parametrize("seed", range(12))
def test_sweeps_over_mode_blocks_give_the_dense_sweeps_bound(seed):
    """Kept as diagonal blocks, a moded edge's potentials sweep to the same bound and
    reduced costs as kept whole, and the bound holds against every plan."""
    p = _moded_problem(seed)
    blocked, dense = Ascent(p), Ascent(replace(p, blocks={}))
    assert sum(s.edge.size for s, _ in blocked._st.pairs) < sum(
        s.edge.size for s, _ in dense._st.pairs
    )
    for ascent in (blocked, dense):
        ascent.raise_bound()
    got, want = blocked.result(), dense.result()
    assert got.bound == want.bound and got.lam == want.lam
    for r in p.linear:
        np.testing.assert_array_equal(got.reduced[r], want.reduced[r])
    best = min((cost for _, cost in _plans(p)), default=math.inf)
    assert got.bound <= best + 1e-9 * max(1.0, best)


@pytest.mark.parametrize("seed", range(8))
def test_edge_potentials_formed_a_few_rows_at_a_time_give_the_same_ascent(seed, monkeypatch):
    """An edge's minima taken over a few of its rows at a time (as a 4-D mesh's edges of
    millions of prices are) give the same bound, multiplier and reduced costs, to the
    last bit, as taken over the whole edge at once, on plain and moded edges."""
    from autoplan.ilp.bound import dual_layout

    chunked = 0
    for p in (random_problem(seed), routed_problem(seed), _moded_problem(seed)):
        whole = Ascent(p)
        whole.raise_bound()
        monkeypatch.setattr(dual_layout, "_CHUNK", 1)  # one row per numpy call
        parts = Ascent(p)
        chunked += sum(s._step < s.edge.shape[1] for s, _ in parts._st.pairs)
        parts.raise_bound()
        monkeypatch.undo()
        _assert_same_ascent(parts, whole, p)
    assert chunked


@pytest.mark.parametrize("seed", range(8))
def test_the_bound_read_from_theta_after_a_sweep_is_the_bound_from_the_messages(seed):
    """Right after a sweep every edge's least potential is 0, so the bound reads θ alone;
    fresh, after a restore and after a new multiplier it must read the edges too. At each
    point it equals the bound recomputed from the messages (to rounding: a sweep takes
    its minima in float32, so an edge's least potential after it is 0 to float32's)."""

    def same(ascent: Ascent) -> None:
        want = ascent.result().bound
        assert ascent._st.bound() == pytest.approx(want, rel=1e-6, abs=1e-6)

    for p in (random_problem(seed), routed_problem(seed), _moded_problem(seed)):
        ascent = Ascent(p)
        st = ascent._st
        fresh = st.snapshot()
        same(ascent)
        for lam in (0.0, 0.5, 2.0):
            st.set_lam(lam)
            same(ascent)
            st.sweep()
            same(ascent)
        st.restore(fresh)
        same(ascent)


def test_relax_grows_its_lp_columns_only_while_the_lp_value_falls(monkeypatch):
    """With the ascent held below the LP (no refine at the LP's multiplier), the rounds of
    the LP over near columns stop once more columns leave its value where it was: the
    distance left is the bound's, and a third LP over yet more columns would not move it."""
    from autoplan.ilp.bound import relax as relax_module

    real = relax_module.run
    monkeypatch.setattr(Ascent, "refine", lambda self, lam, settle: False)
    stalled = 0
    for p in [random_problem(s) for s in range(40)] + [routed_problem(s) for s in range(40)]:
        values: list[float] = []

        def counted(m, *args, values=values, **kwargs):
            lp = real(m, *args, **kwargs)
            if lp.x is not None:  # an infeasible whole LP (no plan decoded) has none
                values.append(float(m.cost @ lp.x) + m.offset)
            return lp

        monkeypatch.setattr(relax_module, "run", counted)
        relax(ilp_model(p))
        for before, after in itertools.pairwise(values[:-1]):
            assert after < before  # an LP ran after a round that fell
        stalled += len(values) > 1 and values[-1] >= values[-2]
    assert stalled  # some problem stops on a value that did not fall


def test_a_multiplier_from_a_nearly_equal_solve_only_raises_the_bound():
    """Given a λ (the LP's, a bad one), raise_bound's bound is no lower than without it and
    still below every plan; at the LP's λ it is higher on some problems (the search
    stops on the messages' own λ)."""
    higher = 0
    for p in [random_problem(s) for s in range(25)] + [routed_problem(s) for s in range(25)]:
        plans = _plans(p)
        if p.budget is None or not plans:
            continue
        alone = Ascent(p)
        alone.raise_bound()
        m = ilp_model(p).emitted.matrix
        row = np.isneginf(m.row_lower)
        if not row.any():
            continue  # the budget cannot bind: the matrix has no memory row
        lp = run(m, "highs", mip=False, time_limit_s=None, mip_gap=0.0)
        assert lp.y is not None
        lp_lam = max(0.0, -float(lp.y[row][0]))
        for lam in (lp_lam, 0.0, 3.0 * lp_lam + 1.0):
            hinted = Ascent(p)
            hinted.raise_bound(lam=lam)
            bound = hinted.result().bound
            assert bound >= alone.result().bound - 1e-9 * max(1.0, abs(bound))
            assert all(bound <= cost + 1e-9 * max(1.0, cost) for _, cost in plans)
            higher += lam == lp_lam and bound > alone.result().bound * (1 + 1e-6)
    assert higher


def test_a_refine_that_cannot_pass_its_first_bound_gives_up_early(monkeypatch):
    """At a multiplier far off, refine stops once the bound, rising at its last sweep's
    rate, cannot pass the bound it began from: never more sweeps than converging to the
    tolerance, fewer on some problem, and the same bound kept."""
    converge = _Ascent.converge

    def refined(p: Problem, lam: float, reach: bool) -> tuple[bool, int, float]:
        ascent = Ascent(p)
        ascent.raise_bound()
        sweeps = ascent.sweeps
        if not reach:
            monkeypatch.setattr(_Ascent, "converge", lambda st, rise, reach: converge(st, rise))
        kept = ascent.refine(lam)
        monkeypatch.setattr(_Ascent, "converge", converge)
        return kept, ascent.sweeps - sweeps, ascent.result().bound

    fewer = 0
    for p in [random_problem(s) for s in range(40)] + [routed_problem(s) for s in range(40)]:
        if p.budget is None:
            continue
        lam = 10.0 * ascend(p).lam + 10.0
        kept, sweeps, bound = refined(p, lam, reach=True)
        kept_all, sweeps_all, bound_all = refined(p, lam, reach=False)
        assert sweeps <= sweeps_all
        if not kept_all:  # the bound it began from, either way
            assert not kept and bound == bound_all
        fewer += sweeps < sweeps_all
    assert fewer


def test_a_relax_round_keeps_the_used_and_then_the_least_priced_columns_up_to_its_cap():
    """The columns of an LP round: those priced within ``near`` and the used ones; over the
    cap, the used and then the least priced (ties by column), never one priced past near."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        dj = rng.choice([0.0, 1.0, 2.0, 3.0, 5.0, 8.0], 40)
        used = rng.random(40) < 0.2
        near = float(rng.choice([2.0, 5.0]))
        plain = (dj <= near) | used
        assert (_cheapest(dj, near, used, math.inf) == plain).all()
        most = int(rng.integers(1, 40))
        keep = _cheapest(dj, near, used, most)
        assert (keep >= used).all() and not (keep & ~plain).any()
        assert keep.sum() == max(min(most, plain.sum()), used.sum())
        extra = keep & ~used
        left = plain & ~keep
        if extra.any() and left.any():  # nothing left out is cheaper than what was taken
            worst = dj[extra].max()
            assert dj[left].min() >= worst
            tied = np.flatnonzero(left & (dj == worst))
            assert not len(tied) or tied.min() > np.flatnonzero(extra & (dj == worst)).max()


@pytest.mark.parametrize("seed", range(6))
def test_visits_on_worker_threads_give_the_same_ascent_to_the_last_bit(seed, monkeypatch):
    """A class's edges' minima taken on worker threads (as a 4-D mesh's large classes
    take them) give the same bound, multiplier, sweeps and reduced costs as taken in turn."""
    from autoplan.ilp.bound import dual

    threaded = 0
    for p in (random_problem(seed), routed_problem(seed), _moded_problem(seed)):
        monkeypatch.setattr(dual, "_THREADED_PRICES", 1 << 62)
        alone = Ascent(p)
        alone.raise_bound()
        monkeypatch.setattr(dual, "_THREADED_PRICES", 0)
        monkeypatch.setattr(dual, "_WORKERS", 2)
        pooled = Ascent(p)
        threaded += sum(pooled._st._threaded.values())
        pooled.raise_bound()
        monkeypatch.undo()
        _assert_same_ascent(pooled, alone, p)
        assert pooled._st._pool is None  # the threads end with the sweeps
    assert threaded


def test_a_refine_not_kept_is_not_swept_again_from_the_same_state():
    """Refined at a multiplier far off and not kept, the same refinement asked again makes
    no sweep and keeps the bound; one at another multiplier still sweeps, and after a
    kept refinement the first may be tried again."""
    tried = 0
    for p in [random_problem(s) for s in range(40)] + [routed_problem(s) for s in range(40)]:
        if p.budget is None:
            continue
        ascent = Ascent(p)
        ascent.raise_bound()
        lam = 10.0 * ascent.result().lam + 10.0
        if ascent.refine(lam):
            continue
        tried += 1
        sweeps, bound = ascent.sweeps, ascent.result().bound
        assert not ascent.refine(lam)
        assert ascent.sweeps == sweeps and ascent.result().bound == bound
        ascent.refine(lam + 1.0)
        assert ascent.sweeps > sweeps
        if ascent.refine(ascent.result().lam * 0.5):  # a kept one: the state changed
            before = ascent.sweeps
            ascent.refine(lam)
            assert ascent.sweeps > before
    assert tried
