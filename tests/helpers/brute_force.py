"""Brute force over a small planning problem: every plan, its step time and bytes, the cheapest.

The ILP tests check the solver's optimum exactly against these, so the problems they
use stay small (at most a few thousand strategy combinations). One enumeration serves
both shapes of problem: a :class:`CostTable` (nodes' compute and edges' moves) and an
ILP :class:`Problem` (classes' linear costs and edges), through the cost and memory
functions passed in. The dominated rows of a feature matrix, every pair compared on every
column, are what the pruning tests check its dominance check against.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sized

import numpy as np

from autoplan.cost.price import CostTable
from autoplan.ilp.bound.incumbent import cost_of, memory_of
from autoplan.ilp.formulation.problem import Problem

Choice = dict[str, int]


def every_choice(
    options: Mapping[str, Sized], allowed: Mapping[str, np.ndarray] | None = None
) -> list[Choice]:
    """Every combination of one strategy per name (among those ``allowed`` keeps), one dict each."""
    names = list(options)
    ranges = [
        np.flatnonzero((allowed or {}).get(v, np.ones(len(options[v]), dtype=bool))) for v in names
    ]
    return [dict(zip(names, map(int, c), strict=True)) for c in itertools.product(*ranges)]


def plans_within(
    choices: list[Choice],
    cost: Callable[[Choice], float],
    *,
    memory: Callable[[Choice], float] | None = None,
    budget: float | None = None,
) -> Iterator[tuple[Choice, float]]:
    """Each choice whose ``memory`` is within ``budget`` (all of them without one), with its cost."""
    for choice in choices:
        if budget is not None and memory(choice) > budget:
            continue
        yield choice, cost(choice)


# ---------------------------------------------------------------- cost tables


def step_time(costs: CostTable, choice: Mapping[str, int]) -> float:
    """Step time of ``choice`` by the ILP's objective, inf when a move is impossible."""
    total = sum(float(costs.compute[v][i]) for v, i in choice.items())
    for e in costs.edges:
        total += float(e.cost[e.src_group[choice[e.src]], e.dst_group[choice[e.dst]]])
    return total


def footprint(costs: CostTable, choice: Mapping[str, int]) -> float:
    """Bytes per device of ``choice``: the memory constraint's left-hand side."""
    return sum(float(m[choice[p]]) for p, m in costs.memory.items())


def combos(costs: CostTable, allowed: Mapping[str, np.ndarray] | None = None) -> list[Choice]:
    """Every combination of allowed strategies of a cost table, one dict per plan."""
    return every_choice(costs.compute, allowed)


def brute_force(
    costs: CostTable,
    *,
    allowed: Mapping[str, np.ndarray] | None = None,
    budget: float | None = None,
) -> float:
    """Minimum of ``step_time`` over every allowed combination within the budget (inf if none)."""
    plans = plans_within(
        combos(costs, allowed),
        lambda c: step_time(costs, c),
        memory=lambda c: footprint(costs, c),
        budget=budget,
    )
    return min((cost for _, cost in plans), default=math.inf)


# ---------------------------------------------------------------- ILP problems


def problem_plans(p: Problem) -> Iterator[tuple[Choice, float]]:
    """Every plan of ``p`` within its budget, with its cost (inf when a move is impossible)."""
    return plans_within(
        every_choice(p.linear),
        lambda c: cost_of(p, c),
        memory=lambda c: memory_of(p, c),
        budget=p.budget,
    )


def brute_force_problem(p: Problem) -> float:
    """The cheapest plan of ``p`` within its budget (inf if none)."""
    return min((cost for _, cost in problem_plans(p)), default=math.inf)


def best_within(p, keep=lambda choice: True) -> float:
    """The cheapest plan of ``p`` within its budget that ``keep`` accepts (inf: none)."""
    return min((c for choice, c in problem_plans(p) if keep(choice)), default=math.inf)


def dominated_rows(f: np.ndarray) -> np.ndarray:
    """Rows of ``f`` that another row is <= everywhere, the first of equal rows staying:
    every pair compared on every column (what the pruning's dominance check must find)."""
    le = (f[:, None, :] <= f[None, :, :]).all(axis=2)
    ge = (f[:, None, :] >= f[None, :, :]).all(axis=2)
    idx = np.arange(len(f))
    beats = le & (~ge | (idx[:, None] < idx[None, :]))
    np.fill_diagonal(beats, False)
    return beats.any(axis=0)
