"""Stage 5c (bound), memory price: the memory row's multiplier for given class potentials.

Input: a reduced :class:`~autoplan.ilp.formulation.problem.Problem` and its classes'
potentials at a multiplier λ (:mod:`autoplan.ilp.bound.dual`). Output: the λ >= 0 at
which the dual bound, with every message held, is highest.

Why its own module: it is the one step of the dual ascent that looks at the
memory budget, and the only one whose work grows with the number of weight
classes (one per weight copy in an untied model) rather than with the edges. How:
the bound's part that depends on λ is concave and its slope is the budget less the
memory of every class's cheapest strategy, so a bisection on that slope's sign finds
the peak; the classes are laid end to end
(:class:`Knapsack`) so that each step is a few array operations.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autoplan.ilp.formulation.matrix import MEMORY_UNIT
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.tolerances import LAMBDA_BISECTED

__all__ = ["Knapsack", "best_lam", "budget_can_bind"]

# The search for λ doubles from this first guess (µs per MiB; or from the λ held, when
# larger) until the budget holds, and stops past _LAMBDA_MAX: memory outweighs every
# price there, so a budget still exceeded is one no plan meets.
_LAMBDA_START = 1e-6
_LAMBDA_MAX = 1e15


def budget_can_bind(p: Problem) -> bool:
    """Whether the largest footprint of every weight class, summed, exceeds the budget."""
    if p.budget is None or not p.memory:
        return False
    most = sum(float(m[p.allowed(r)].max()) for r, m in p.memory.items())
    return most > p.budget


def best_lam(p: Problem, theta: Mapping[str, np.ndarray], lam: float) -> float:
    """The λ >= 0 that maximizes the bound with the messages held, given the class
    potentials ``theta`` at multiplier ``lam``: where the memory of each class's
    cheapest strategy, summed, stops exceeding the budget."""
    assert p.budget is not None, "a multiplier is sought only when the budget can bind"
    sack = Knapsack(
        [theta[r] - lam * m / MEMORY_UNIT for r, m in p.memory.items()],
        [m / MEMORY_UNIT for m in p.memory.values()],
        float(p.budget) / MEMORY_UNIT,
    )
    if not sack.over(0.0):
        return 0.0
    lo, hi = 0.0, max(lam, _LAMBDA_START)
    while sack.over(hi):
        lo, hi = hi, 2.0 * hi
        if hi > _LAMBDA_MAX:
            return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if sack.over(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= LAMBDA_BISECTED * hi:
            break
    # the bound is concave in λ and its slope changes sign in [lo, hi]: take the better end
    return max((lo, hi), key=sack.value)


class Knapsack:
    """The memory classes' potentials without λ (``base``) and footprints in MiB, laid
    end to end so that each question about a λ is a few array operations, whatever the
    number of classes (an untied model has one per weight copy)."""

    def __init__(self, base: list[np.ndarray], mib: list[np.ndarray], budget: float) -> None:
        self.base, self.mib = np.concatenate(base), np.concatenate(mib)
        lengths = np.array([len(b) for b in base])
        self.starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        self.lengths, self.budget = lengths, budget

    def _lows(self, lam: float) -> tuple[np.ndarray, np.ndarray]:
        v = self.base + lam * self.mib
        return v, np.minimum.reduceat(v, self.starts)

    def over(self, lam: float) -> bool:
        """Whether each class's cheapest strategy at ``lam`` (the first, on a tie), summed,
        exceeds the budget."""
        v, low = self._lows(lam)
        at = np.flatnonzero(v == np.repeat(low, self.lengths))
        _, first = np.unique(np.searchsorted(self.starts, at, side="right"), return_index=True)
        return float(self.mib[at[first]].sum()) > self.budget

    def value(self, lam: float) -> float:
        """The part of the bound that depends on λ."""
        return float(self._lows(lam)[1].sum()) - lam * self.budget
