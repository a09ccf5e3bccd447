"""The exact ILP reductions (pruning, folding, reduced-cost fixing) keep the optimum."""

from __future__ import annotations

import functools

import pytest
import torch

import autoplan
from autoplan.cost.price import price
from autoplan.ilp.formulation.build import build_ilp
from autoplan.ilp.reductions.followers import collapse_followers
from autoplan.ilp.reductions.tying import cluster
from autoplan.ilp.solver.stage import solve_ilp
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.constraints import allowed_strategies
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint


@functools.cache
def _tiny_llama_costs(layers: int, shape: tuple[int, ...]):
    """Followers-collapsed costs and the input constraint of a tiny LLaMA on a fake mesh."""
    mesh = autoplan.fake_mesh(shape, ("dp", "tp", "cp", "ep")[: len(shape)])
    with torch.device("meta"):
        model = Transformer(tiny(layers))
    traced, _ = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (8, 32))), mm_mode="einsum"
    )
    table = enumerate_strategies(traced, mesh)
    costs = price(table, traced, autoplan.Topology())
    spec = ["S(0)" + "R" * (len(shape) - 1)]
    allowed, _ = allowed_strategies(traced, table, spec, None, None)
    return collapse_followers(table, costs, keep=set(allowed)).costs, allowed


def _objective(costs, allowed, budget, *, reduced: bool) -> tuple[float, dict]:
    tie = cluster(costs) if reduced else None
    model = build_ilp(
        costs,
        allowed=allowed,
        memory_budget_bytes=budget,
        tie=tie.rep if tie else None,
        edge_keys=tie.edge_keys if tie else None,
        prune=reduced,
    )
    # HiGHS within 0.02 % of the bound: the plain ILPs of 4 layers have ~10^5 binaries and
    # CBC does not prove them optimal in minutes. Each objective is within 0.02 % of its
    # ILP's optimum, so agreeing within 0.1 % puts the two optima within 0.14 %. Both use
    # reduced-cost fixing (exact, checked against brute force above): without it the plain
    # budgeted 2-layer 2x2x2 ILP ran over 50 minutes; with the LP's reduced costs, 6
    # minutes; with the dual ascent's prices the 4-layer one takes about 6 s.
    sol, _ = solve_ilp(costs, model, solver="highs", mip_gap=2e-4, untie=tie is not None)
    assert sol.status == "optimal"
    return sol.objective_us, sol.choice


TINY_LLAMAS = [(2, (2, 2)), (4, (2, 2)), (2, (2, 2, 2)), (4, (2, 2, 2))]
# A 4-D mesh, as frontier runs use: the pruning's products of per-axis choices are widest there.
FOUR_D = (2, (2, 2, 2, 2))


@pytest.mark.slow
@pytest.mark.parametrize("layers,shape", [*TINY_LLAMAS, FOUR_D])
def test_reduced_ilp_matches_plain_on_tiny_llama(layers, shape):
    """Tied, pruned and fixed: the objective equals the plain ILP's within 0.1 %."""
    costs, allowed = _tiny_llama_costs(layers, shape)
    plain, _ = _objective(costs, allowed, None, reduced=False)
    reduced, _ = _objective(costs, allowed, None, reduced=True)
    assert reduced == pytest.approx(plain, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("layers,shape", TINY_LLAMAS)
def test_reduced_ilp_matches_plain_under_a_binding_budget(layers, shape):
    """Under a budget the free plan does not meet, tied, pruned, fixed and untied: the
    objective equals the plain ILP's within 0.1 %."""
    costs, allowed = _tiny_llama_costs(layers, shape)
    free, choice = _objective(costs, allowed, None, reduced=True)
    low = sum(float(m.min()) for m in costs.memory.values())
    used = sum(float(costs.memory[p][choice[p]]) for p in costs.memory)
    budget = (low + used) / 2  # binding: the free plan does not fit
    plain_b, _ = _objective(costs, allowed, budget, reduced=False)
    reduced_b, _ = _objective(costs, allowed, budget, reduced=True)
    assert plain_b > free
    assert reduced_b == pytest.approx(plain_b, rel=1e-3)
