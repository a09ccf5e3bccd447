"""Stage 5c (bound), memory price: the memory row's multiplier for given class potentials.

Input: a reduced :class:`~autoplan.ilp.formulation.problem.Problem` and its classes'
potentials at a multiplier λ (:mod:`autoplan.ilp.bound.dual`). Output: the λ >= 0 at
which the dual bound, with every message held, is highest (:func:`best_lam`), and the
steps of the search for the λ at which it is highest with the messages settled too
(:func:`find_root`, run on an ascent's messages by :func:`search_lam`).

Why its own module: it is the one step of the dual ascent that looks at the
memory budget, and the only one whose work grows with the number of weight
classes (one per weight copy in an untied model) rather than with the edges. How:
the bound's part that depends on λ is concave and its slope is the budget less the
memory of every class's cheapest strategy, so a bisection on that slope's sign finds
the peak; the classes are laid end to end
(:class:`Knapsack`) so that each step is a few array operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from autoplan.ilp.formulation.matrix import MEMORY_UNIT
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.tolerances import LAMBDA_BISECTED, LAMBDA_FOUND

if TYPE_CHECKING:  # the ascent's state, which calls the search: typed, not imported
    from autoplan.ilp.bound.dual import _Ascent

__all__ = ["Knapsack", "best_lam", "budget_can_bind", "find_root", "search_lam"]

# The search for λ doubles from this first guess (µs per MiB; or from the λ held, when
# larger) until the budget holds, and stops past _LAMBDA_MAX: memory outweighs every
# price there, so a budget still exceeded is one no plan meets.
_LAMBDA_START = 1e-6
_LAMBDA_MAX = 1e15
# The search for the bound's peak (find_root) stops once found (tolerances.LAMBDA_FOUND)
# or after this many secant steps.
_LAMBDA_STEPS = 20


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


def find_root(g: Callable[[float], float], g0: float, stop: Callable[[], bool]) -> None:
    """Step ``g`` (the multiplier search's, positive below its root and negative above
    it, but read with noise) toward its root from ``g(0) = g0``: secant steps, at most 4x
    the last while the root is not bracketed, then the Illinois rule; ``stop`` ends the
    search early. The caller keeps what the steps found."""
    a, ga = 0.0, g0
    b = ga
    gb = g(b) if b > 0 else 0.0
    # g > 0 at every λ up to lo and < 0 from hi on, as far as the steps have seen: g is
    # found on messages converged only to a tolerance, so a secant through two nearby
    # steps can point back past where g was already seen positive (to a λ whose bound is
    # known low, and whose messages take as many sweeps as a cold start).
    lo, hi = (b, math.inf) if gb > 0 else (0.0, b)
    for _ in range(_LAMBDA_STEPS):
        if abs(gb) <= LAMBDA_FOUND * b or b == a or stop():
            break
        c = b - gb * (b - a) / (gb - ga) if gb != ga else b + gb
        if ga * gb > 0 and gb > 0:  # not bracketed yet: extrapolate, at most 4x the last step
            c = min(c, b + 4.0 * abs(b - a))
        if not lo < c < hi:  # past what the steps have seen: a step on, or halve
            c = lo + abs(b - a) if math.isinf(hi) else 0.5 * (lo + hi)
        if ga * gb > 0:
            a, ga, b = b, gb, c
            gb = g(b)
            lo, hi = (max(lo, b), hi) if gb > 0 else (lo, min(hi, b))
            continue
        gc = g(c)
        lo, hi = (max(lo, c), hi) if gc > 0 else (lo, min(hi, c))
        if gc * gb < 0:
            a, ga = b, gb
        else:
            ga *= 0.5  # Illinois: keep the far end from stalling the secant
        b, gb = c, gc


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


def search_lam(st: _Ascent, enough: float = math.inf) -> int:
    """Find λ where the bound, maximized over the messages, peaks (or one where it
    reaches ``enough``); returns the sweeps.

    With the messages converged at λ, the λ that is best for them
    (:func:`best_lam`) lies on the side of the peak:
    ``g(λ) = best - λ`` is positive below it and negative above it. Secant steps on g
    find its root (Illinois rule once it is bracketed), each step's messages
    warm-started from the last; the messages and λ with the highest bound are kept.
    """
    sweeps = 0
    best = (st.bound(), st.snapshot())

    def g(lam: float) -> float:
        nonlocal sweeps, best
        st.set_lam(lam)
        sweeps += st.converge()
        now = st.bound()
        if now > best[0]:
            best = (now, st.snapshot())
        return best_lam(st.p, st.theta, st.lam) - lam

    find_root(
        g,
        best_lam(st.p, st.theta, st.lam),
        stop=lambda: best[0] >= enough or st.past_deadline(),
    )
    st.restore(best[1])
    return sweeps
