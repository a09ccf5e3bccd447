"""The incumbent's roundings of an LP solution (autoplan.ilp.bound.incumbent)."""

from __future__ import annotations

import math

import numpy as np

from autoplan.ilp.bound.incumbent import cost_of, from_lp, memory_of
from autoplan.ilp.formulation.problem import Edge, Problem


def _two_layouts() -> Problem:
    """Two weights that must share a layout, X or Y; X is free and Y costs 5 a class. Each
    layout fills the budget of 3 exactly, a's X and b's Y being the large footprints."""
    linear = {"a": np.array([0.0, 5.0]), "b": np.array([0.0, 5.0])}
    memory = {"a": np.array([2.0, 1.0]), "b": np.array([1.0, 2.0])}
    match = np.array([[0.0, math.inf], [math.inf, 0.0]])
    edges = [Edge("a", "b", np.arange(2), np.arange(2), match, "a -> b")]
    return Problem(linear, memory, edges, {"a": "a", "b": "b"}, 3.0)


def test_an_lp_mixing_two_plans_rounds_to_the_heavier_one():
    """Each class's leanest strategy joins a's Y to b's X, which no edge allows; the LP's
    heavier plan, X everywhere, fits and is the optimum."""
    p = _two_layouts()
    values = {"a": np.array([0.95, 0.05]), "b": np.array([0.95, 0.05])}
    found = from_lp(p, values)
    assert found is not None
    choice, cost = found
    assert choice == {"a": 0, "b": 0}
    assert cost == cost_of(p, choice) == 0.0
    assert memory_of(p, choice) <= 3.0
