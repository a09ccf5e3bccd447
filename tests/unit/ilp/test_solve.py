"""Tests for autoplan.ilp: build_ilp + solve against brute force on tiny random graphs.

Every random case is small enough (at most 4**6 strategy combinations) to
enumerate, so the ILP's optimum is checked exactly, not bounded.
"""

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import pytest

from autoplan.core.torch_adapter import Replicate, Shard
from autoplan.cost.price import GRAD_SLOT, CostTable, EdgeCost
from autoplan.ilp.backends import SolverCrashed
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.formulation.problem import InfeasibleError
from autoplan.ilp.reductions.followers import collapse_followers
from autoplan.ilp.solver.solve import solve
from autoplan.memory.recompute import priced_recompute
from autoplan.strategies.table import (
    InputRef,
    NodeStrategies,
    Strategy,
    StrategyTable,
    TensorInfo,
)
from tests.helpers.brute_force import brute_force, combos, footprint, step_time
from tests.helpers.ilp_problems import FEASIBLE_MEMORY_SEEDS, SEEDS, random_costs

APPROX = {"rel": 1e-6, "abs": 1e-6}


def _check_against_brute_force(
    costs: CostTable,
    *,
    allowed: Mapping[str, np.ndarray] | None = None,
    budget: float | None = None,
) -> str:
    """Solve with CBC and compare with brute force; returns how the case ended."""
    best = brute_force(costs, allowed=allowed, budget=budget)
    if not math.isfinite(best):
        try:
            model = build_ilp(costs, allowed=allowed, memory_budget_bytes=budget)
        except ValueError:
            return "build_error"
        assert solve(model, solver="cbc").status == "infeasible"
        return "infeasible"
    sol = solve(build_ilp(costs, allowed=allowed, memory_budget_bytes=budget), solver="cbc")
    assert sol.status == "optimal"
    assert sol.objective_us == pytest.approx(best, **APPROX)
    assert set(sol.choice) == set(costs.compute)
    for v, i in (allowed or {}).items():
        assert i[sol.choice[v]], f"{v} got strategy {sol.choice[v]} outside its mask"
    assert step_time(costs, sol.choice) == pytest.approx(sol.objective_us, **APPROX)
    if budget is not None:
        assert footprint(costs, sol.choice) <= budget
    return "optimal"


@pytest.mark.parametrize("seed", SEEDS)
def test_random_dag_matches_brute_force(seed):
    """On a random DAG the ILP optimum and its choice's cost equal brute force."""
    _check_against_brute_force(random_costs(seed))


def test_random_cases_cover_feasible_and_infeasible():
    """The random seeds exercise both outcomes, so the brute-force check is not vacuous."""
    best = [brute_force(random_costs(seed)) for seed in SEEDS]
    assert any(math.isfinite(b) for b in best)
    assert any(not math.isfinite(b) for b in best)


def test_all_impossible_moves_between_free_nodes_raises():
    """With choices on both sides and every move impossible, build_ilp names the edge."""
    edge = EdgeCost("a", 0, "b", 0, np.array([0, 1]), np.array([0, 1]), np.full((2, 2), np.inf))
    costs = CostTable(compute={"a": np.ones(2), "b": np.ones(2)}, edges=(edge,), memory={})
    with pytest.raises(InfeasibleError, match=r"edge a -> b"):
        build_ilp(costs)


def test_impossible_move_between_fixed_nodes_raises():
    """With one strategy on each side and an impossible move, build_ilp raises naming the edge."""
    edge = EdgeCost("a", 0, "b", 0, np.array([0]), np.array([0]), np.array([[np.inf]]))
    costs = CostTable(compute={"a": np.ones(1), "b": np.ones(1)}, edges=(edge,), memory={})
    with pytest.raises(ValueError, match=r"edge a -> b"):
        build_ilp(costs)


def test_impossible_moves_from_fixed_node_remove_strategies():
    """A fixed producer's impossible moves remove those consumer strategies; the rest stay."""
    edge = EdgeCost("a", 0, "b", 0, np.array([0]), np.array([0, 1, 1]), np.array([[np.inf, 5.0]]))
    costs = CostTable(
        compute={"a": np.ones(1), "b": np.array([0.0, 3.0, 1.0])}, edges=(edge,), memory={}
    )
    sol = solve(build_ilp(costs), solver="cbc")
    assert sol.choice == {"a": 0, "b": 2}
    assert sol.objective_us == pytest.approx(1.0 + 1.0 + 5.0, **APPROX)


def test_node_with_only_infinite_compute_raises():
    """A node none of whose strategies can run is rejected by name."""
    costs = CostTable(compute={"a": np.array([np.inf, np.inf])}, edges=(), memory={})
    with pytest.raises(ValueError, match=r"node a has no allowed strategy"):
        build_ilp(costs)


@pytest.mark.parametrize("seed", SEEDS)
def test_memory_budget_matches_brute_force(seed):
    """Under a memory budget between the smallest and largest footprint, ILP equals brute force."""
    costs = random_costs(seed, memory=True)
    footprints = sorted({footprint(costs, c) for c in combos(costs)})
    budget = footprints[len(footprints) // 2]
    _check_against_brute_force(costs, budget=budget)


@pytest.mark.parametrize("seed", FEASIBLE_MEMORY_SEEDS)
def test_memory_budget_below_minimum_is_infeasible(seed):
    """A budget below every plan's footprint makes an otherwise feasible solve infeasible."""
    costs = random_costs(seed, memory=True)
    smallest = sum(float(m.min()) for m in costs.memory.values())
    assert solve(build_ilp(costs, memory_budget_bytes=smallest - 1), solver="cbc").status == (
        "infeasible"
    )


def test_memory_budget_binds():
    """The cheapest strategy is refused when it does not fit; the fitting one is chosen."""
    costs = CostTable(
        compute={"p": np.array([1.0, 5.0]), "q": np.array([1.0, 2.0])},
        edges=(),
        memory={"p": np.array([100.0, 10.0]), "q": np.array([10.0, 10.0])},
    )
    sol = solve(build_ilp(costs, memory_budget_bytes=50.0), solver="cbc")
    assert (sol.status, sol.choice) == ("optimal", {"p": 1, "q": 0})
    assert sol.objective_us == pytest.approx(6.0, **APPROX)


FIXED_OVER_BUDGET = {
    # p and q have one strategy each: the model has no variable at all
    "all_fixed": CostTable(
        compute={"p": np.array([1.0]), "q": np.array([1.0])},
        edges=(),
        memory={"p": np.array([100.0]), "q": np.array([10.0])},
    ),
    # q has two strategies, but p's only placement cannot reach q's second one
    "fixed_by_fold": CostTable(
        compute={"p": np.array([1.0]), "q": np.array([1.0, 2.0])},
        edges=(
            EdgeCost("p", 0, "q", 0, np.array([0]), np.array([0, 1]), np.array([[0.0, np.inf]])),
        ),
        memory={"p": np.array([100.0]), "q": np.array([10.0, 10.0])},
    ),
}


@pytest.mark.parametrize("case", sorted(FIXED_OVER_BUDGET))
def test_memory_budget_below_fixed_nodes_footprint_is_infeasible(case):
    """Single-strategy nodes that alone exceed the budget give ValueError or 'infeasible'."""
    try:
        model = build_ilp(FIXED_OVER_BUDGET[case], memory_budget_bytes=50.0)
    except ValueError as err:
        assert "memory" in str(err)
        return
    assert solve(model, solver="cbc").status == "infeasible"


def test_memory_budget_below_fixed_footprint_with_free_node_is_infeasible():
    """Fixed nodes over budget next to a node with a choice: the solver reports infeasible."""
    costs = CostTable(
        compute={"p": np.array([1.0]), "q": np.array([1.0, 2.0])},
        edges=(),
        memory={"p": np.array([100.0]), "q": np.array([10.0, 10.0])},
    )
    assert solve(build_ilp(costs, memory_budget_bytes=50.0), solver="cbc").status == "infeasible"


@pytest.mark.parametrize("seed", SEEDS)
def test_allowed_single_strategy_is_chosen(seed):
    """A node restricted to one strategy gets it, and the optimum equals brute force."""
    costs = random_costs(seed)
    rng = np.random.default_rng(1000 + seed)
    names = list(costs.compute)
    v = names[int(rng.integers(len(names)))]
    k = int(rng.integers(len(costs.compute[v])))
    mask = np.zeros(len(costs.compute[v]), dtype=bool)
    mask[k] = True
    allowed = {v: mask}
    if _check_against_brute_force(costs, allowed=allowed) == "optimal":
        assert solve(build_ilp(costs, allowed=allowed), solver="cbc").choice[v] == k


@pytest.mark.parametrize("seed", SEEDS)
def test_many_lone_nodes_fold_and_match_brute_force(seed):
    """Half the nodes kept to one strategy (as untying narrows them): every edge touching one
    is folded away and the optimum equals brute force."""
    costs = random_costs(seed)
    rng = np.random.default_rng(3000 + seed)
    allowed = {}
    for v, c in list(costs.compute.items())[::2]:
        allowed[v] = np.arange(len(c)) == int(rng.integers(len(c)))
    if _check_against_brute_force(costs, allowed=allowed) == "optimal":
        model = build_ilp(costs, allowed=allowed)
        assert all(e.src not in allowed and e.dst not in allowed for e in model.reduced.edges)


@pytest.mark.parametrize("seed", SEEDS)
def test_allowed_masks_match_brute_force(seed):
    """Random masks on every node (each keeping >= 1 strategy) give the brute-force optimum."""
    costs = random_costs(seed)
    rng = np.random.default_rng(2000 + seed)
    allowed = {}
    for v, c in costs.compute.items():
        mask = rng.random(len(c)) < 0.6
        mask[int(rng.integers(len(c)))] = True
        allowed[v] = mask
    _check_against_brute_force(costs, allowed=allowed)


@pytest.mark.parametrize("seed", SEEDS)
def test_gradient_edges_match_brute_force(seed):
    """Gradient edges (slot -1) from later to earlier nodes are plain pairwise costs."""
    costs = random_costs(seed, grad_edges=True)
    assert any(e.slot == GRAD_SLOT for e in costs.edges)
    _check_against_brute_force(costs)


def test_two_cycle_of_edges_matches_brute_force():
    """A forward edge and a gradient edge between the same two nodes both count."""
    fwd = EdgeCost(
        "p", 0, "g", 0, np.array([0, 1]), np.array([0, 1]), np.array([[0.0, 4.0], [4.0, 0.0]])
    )
    grad = EdgeCost(
        "g",
        0,
        "p",
        GRAD_SLOT,
        np.array([0, 1]),
        np.array([0, 1]),
        np.array([[0.0, 9.0], [1.0, 0.0]]),
    )
    costs = CostTable(
        compute={"p": np.array([0.0, 0.0]), "g": np.array([10.0, 0.0])},
        edges=(fwd, grad),
        memory={},
    )
    sol = solve(build_ilp(costs), solver="cbc")
    assert sol.choice == {"p": 1, "g": 1}
    assert sol.objective_us == pytest.approx(brute_force(costs), **APPROX)


S0, S1, R = (Shard(0),), (Shard(1),), (Replicate(),)


INFO = TensorInfo(shape=(8, 8), dtype_bytes=4, dtype="float32")


def _node(
    name: str, kind: str, inputs: tuple[str, ...], strategies: list[Strategy]
) -> NodeStrategies:
    return NodeStrategies(
        name=name,
        op="test.op",
        kind=kind,
        inputs=tuple(InputRef(u, 0) for u in inputs),
        in_tensors=(INFO,) * len(inputs),
        out_tensors=(INFO,),
        strategies=tuple(strategies),
    )


def _placed_edge(
    rng: np.random.Generator,
    u: str,
    v: str,
    src: list,
    dst: list,
    *,
    zero_diagonal: bool = False,
) -> EdgeCost:
    """An edge grouped by placement as price.edge_cost does, with random positive prices."""
    rows, cols = list(dict.fromkeys(src)), list(dict.fromkeys(dst))
    cost = rng.uniform(1.0, 10.0, size=(len(rows), len(cols)))
    if zero_diagonal:
        for r, p in enumerate(rows):
            if p in cols:
                cost[r, cols.index(p)] = 0.0
    return EdgeCost(
        src=u,
        src_out=0,
        dst=v,
        slot=0,
        src_group=np.array([rows.index(p) for p in src]),
        dst_group=np.array([cols.index(p) for p in dst]),
        cost=cost,
        src_placements=tuple(rows),
        dst_placements=tuple(cols),
        tensor=INFO,
    )


def _chain(seed: int) -> tuple[StrategyTable, CostTable]:
    """x (input, 3 placements) -> v (follower, one strategy per placement) -> w (op)."""
    rng = np.random.default_rng(seed)
    placements = [S0, S1, R]
    v_in = [placements[i] for i in rng.permutation(3)]  # v lists them in another order
    w_in = [S0, S1, R, S0]
    x = _node("x", "input", (), [Strategy(outs=(p,), ins=()) for p in placements])
    v = _node("v", "op", ("x",), [Strategy(outs=(p,), ins=(p,)) for p in v_in])
    w = _node("w", "op", ("v",), [Strategy(outs=(R,), ins=(p,)) for p in w_in])
    table = StrategyTable(mesh_shape=(2,), axis_names=("dp",), nodes={"x": x, "v": v, "w": w})
    costs = CostTable(
        compute={"x": np.zeros(3), "v": rng.uniform(0.0, 10.0, 3), "w": rng.uniform(0.0, 10.0, 4)},
        edges=(
            _placed_edge(rng, "x", "v", placements, v_in, zero_diagonal=True),
            _placed_edge(rng, "v", "w", v_in, w_in),
        ),
        memory={},
    )
    return table, costs


@pytest.mark.parametrize("seed", range(5))
def test_collapse_follower_keeps_optimum(seed):
    """Merging a zero-cost follower keeps the optimum, and expand returns a full, equal-cost choice."""
    table, costs = _chain(seed)
    reduction = collapse_followers(table, costs)
    assert reduction.num_merged == 1
    assert reduction.roots["v"][0] == "x"
    assert set(reduction.costs.compute) == {"x", "w"}
    reduced = solve(build_ilp(reduction.costs), solver="cbc")
    full = solve(build_ilp(costs), solver="cbc")
    assert reduced.objective_us == pytest.approx(full.objective_us, **APPROX)
    assert reduced.objective_us == pytest.approx(brute_force(costs), **APPROX)
    choice = reduction.expand(reduced.choice)
    assert set(choice) == set(costs.compute)
    assert step_time(costs, choice) == pytest.approx(reduced.objective_us, **APPROX)


def test_collapse_keep_prevents_merge():
    """A node listed in ``keep`` is not merged."""
    table, costs = _chain(0)
    reduction = collapse_followers(table, costs, keep={"v"})
    assert reduction.num_merged == 0
    assert reduction.costs.compute.keys() == costs.compute.keys()


def test_collapse_skips_node_that_cannot_take_every_placement():
    """A node lacking one of its producer's placements is not a follower."""
    table, costs = _chain(0)
    x_v = costs.edges[0]
    cost = x_v.cost.copy()
    cost[0, x_v.dst_placements.index(x_v.src_placements[0])] = 3.0  # S(0) no longer passes free
    edges = (dataclasses.replace(x_v, cost=cost), costs.edges[1])
    reduction = collapse_followers(table, CostTable(costs.compute, edges, costs.memory))
    assert reduction.num_merged == 0


def test_time_limited_plan_says_so_with_its_gap(meta_mlp, mesh8, monkeypatch):
    """A solve stopped by its time limit gives a plan whose message names the limit and the gap."""
    import torch

    import autoplan
    from autoplan.ilp.solver import stage
    from autoplan.ilp.solver.solve import Solution

    def stopped(model, **kwargs):
        sol = solve(model, **kwargs)
        return dataclasses.replace(sol, status="time_limit", bound_us=sol.objective_us * 0.9)

    monkeypatch.setattr(stage, "solve", stopped)
    config = autoplan.PlanConfig(time_limit_s=7.0)
    plan = autoplan.plan(meta_mlp, lambda: torch.randn(32, 64), mesh8, config=config)
    assert plan.status == "time_limit"
    assert "time_limit_s (7.0 s)" in plan.message
    assert "10.00%" in plan.message
    assert plan.gap == pytest.approx(0.10) and "time_limit (gap 10.000%)" in plan.summary()
    assert Solution("time_limit", 110.0, {}, 1.0, "cbc", bound_us=100.0).gap == pytest.approx(
        10 / 110
    )


def test_solver_stopped_still_returns_the_plan_decoded_from_the_bound(meta_mlp, mesh8, monkeypatch):
    """LP and MIP both stopped: the plan decoded from the dual bound comes back, marked time_limit."""
    import torch

    import autoplan
    from autoplan.ilp.backends import RunResult
    from autoplan.ilp.bound import relax as relax_module
    from autoplan.ilp.solver import solve as solve_module

    for module in (relax_module, solve_module):
        monkeypatch.setattr(module, "run", lambda *a, **k: RunResult("stopped", None))
    config = autoplan.PlanConfig(time_limit_s=2.0)
    plan = autoplan.plan(meta_mlp, lambda: torch.randn(32, 64), mesh8, config=config)
    assert plan.status == "time_limit"
    assert math.isfinite(plan.objective_us)
    assert "time_limit_s (2.0 s)" in plan.message


def test_solver_stopped_before_any_plan_is_an_error_naming_the_limit(meta_mlp, mesh8, monkeypatch):
    """No plan at all by the time limit (nothing decoded, LP and MIP both stopped) is a clear error, not "infeasible"."""
    import torch

    import autoplan
    from autoplan.ilp.backends import RunResult
    from autoplan.ilp.bound import relax as relax_module
    from autoplan.ilp.solver import solve as solve_module

    for module in (relax_module, solve_module):
        monkeypatch.setattr(module, "run", lambda *a, **k: RunResult("stopped", None))
    monkeypatch.setattr(relax_module, "from_plan", lambda *a, **k: None)
    config = autoplan.PlanConfig(time_limit_s=2.0)
    with pytest.raises(ValueError, match=r"plan.time_limit_s \(2.0 s\).*raise plan.time_limit_s"):
        autoplan.plan(meta_mlp, lambda: torch.randn(32, 64), mesh8, config=config)


@pytest.mark.parametrize("seed", SEEDS[:12])
def test_recomputation_and_activations_match_brute_force(seed):
    """Activation checkpointing's pricing (recomputed nodes: compute twice and every move
    into them a second, parallel edge) with activation bytes in the memory row: the ILP
    under a budget equals brute force, and the second edges are priced in full."""
    costs = random_costs(seed, memory=True)
    rng = np.random.default_rng(seed + 1000)
    names = list(costs.compute)
    kept = {v: rng.integers(1, 60, size=len(costs.compute[v])).astype(np.float64) for v in names}
    costs = dataclasses.replace(costs, memory=costs.memory | {
        v: a for v, a in kept.items() if v not in costs.memory and rng.random() < 0.7
    })  # fmt: skip
    chosen = [v for v in names[1:] if rng.random() < 0.5] or names[-1:]
    again = priced_recompute(costs, chosen)
    for choice in combos(costs)[:20]:
        extra = sum(float(costs.compute[v][choice[v]]) for v in chosen)
        extra += sum(
            float(e.cost[e.src_group[choice[e.src]], e.dst_group[choice[e.dst]]])
            for e in costs.edges
            if e.dst in chosen
        )
        assert step_time(again, choice) == pytest.approx(step_time(costs, choice) + extra, **APPROX)
    footprints = sorted({footprint(again, c) for c in combos(again)})
    _check_against_brute_force(again, budget=footprints[len(footprints) // 2])


def test_a_solver_crash_in_the_polish_costs_only_its_search(monkeypatch):
    """The polish only looks for a better incumbent: when the solver crashes on its MIP,
    the final MIP still proves the optimum, and the stats say the polish crashed."""
    from autoplan.ilp.solver import solve as solve_module

    real = solve_module.run
    crashed = []

    def crashing(m, solver, **kw):
        if kw.get("max_nodes") == solve_module._POLISH_NODES:
            crashed.append(1)
            raise SolverCrashed("CBC (cbc) failed with exit code -11: ")
        return real(m, solver, **kw)

    monkeypatch.setattr(solve_module, "run", crashing)
    for seed in SEEDS:
        costs = random_costs(seed, memory=True)
        footprints = sorted({footprint(costs, c) for c in combos(costs)})
        budget = footprints[len(footprints) // 2]
        best = brute_force(costs, budget=budget)
        if not math.isfinite(best):
            continue
        before = len(crashed)
        sol = solve(build_ilp(costs, memory_budget_bytes=budget), solver="cbc")
        assert sol.status == "optimal"
        assert sol.objective_us == pytest.approx(best, **APPROX)
        assert (sol.stats or {}).get("polish_crashed", 0.0) == float(len(crashed) > before)
    assert crashed  # some seed's polish ran, and crashed
