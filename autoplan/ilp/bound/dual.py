r"""Stage 5c (bound), dual: the LP relaxation's bound and reduced costs by dual ascent.

Input: a reduced :class:`~autoplan.ilp.formulation.problem.Problem`. Output: a :class:`Dual`
holding a lower bound on the cost of every plan, per class strategy a reduced
cost (a plan taking that strategy costs at least the bound plus it), the memory
multiplier, and the edge potentials from which
:func:`~autoplan.ilp.bound.dual_prices.column_reduced_costs` prices every column of the
emitted matrix in the same sense.

Why: solved by a general simplex, the LP relaxation is the solve's longest step,
although the problem behind it has few classes and edges. Its dual splits by
edge, and sweeping over the classes reaches the LP's bound to a few millionths
in a fraction of the simplex's time. Nothing here needs to be optimal to be exact: any
messages and any multiplier give a valid bound and valid reduced costs, so the
reduced-cost fixing of :mod:`autoplan.ilp.solver.solve` keeps every plan cheaper
than its incumbent.

How: messages ``a_e`` (over the groups of edge e's source class u) and
``b_e`` (over its destination v's groups) move cost between an edge and its
ends, and λ >= 0 prices the memory row::

    θ_u(i)   = L_u(i) + λ M_u(i) + Σ_{e out of u} a_e(g_e(i)) + Σ_{e into u} b_e(h_e(i))
    φ_e(g,h) = R_e(g,h) - a_e(g) - b_e(h)
    bound    = Σ_u min_i θ_u(i) + Σ_e min_gh φ_e(g,h) - λ · budget

A plan costs the same under θ and φ as under L and R, plus λ (M - budget) <= 0
when it fits the budget, so the bound holds for any messages (its maximum over
them and λ is the LP bound). A sweep visits the classes in order: each takes in
the row minima of its edges (which leaves every edge's minimum at 0), then
hands an equal share of what lies above its own minimum back to the edges
toward the classes it visits next; this never lowers the bound (the scheme of
TRW-S and SRMP for pairwise models). Sweeps alternate forward and backward
until the bound stops rising. λ: with the messages settled at λ, the λ best
for them lies on the side of the bound's peak, and secant steps on that
difference find it to about 1 %; :meth:`Ascent.refine` then settles the
messages at a better λ when one is known (the LP's memory dual, see
:mod:`autoplan.ilp.bound.relax`). :mod:`autoplan.ilp.bound.dual_prices` reads the column
prices and a plan off the result.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from autoplan.cost.block_diagonal import BlockDiagonal
from autoplan.ilp.bound.dual_layout import (
    End,
    Potentials,
    Visit,
    diagonal_blocks,
    flat,
    mode_blocks,
    rounded_down,
    starts,
)
from autoplan.ilp.bound.dual_seed import seed_messages, warm_fits
from autoplan.ilp.bound.memory_price import budget_can_bind, search_lam
from autoplan.ilp.formulation.build import Warm
from autoplan.ilp.formulation.matrix import MEMORY_UNIT
from autoplan.ilp.formulation.problem import Problem
from autoplan.ilp.tolerances import (
    ASCENT_CONVERGED_REFINE,
    ASCENT_CONVERGED_SEARCH,
)

# A run of sweeps stops once converged (tolerances.ASCENT_CONVERGED_*) or after this many
# forward-and-backward pairs: a bound is valid wherever the sweeps stop.
_MAX_SWEEPS = 200
# A visit whose edges hold this many prices or more takes their row minima on worker
# threads (numpy's subtract and min release the GIL; each edge's minima are the same
# whichever thread takes them): below it, the hand-over costs more than it saves.
_THREADED_PRICES = 1 << 20
_WORKERS = max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class Dual:
    """A lower bound on every plan's cost and what it says per strategy and column.

    ``reduced[r][i]``: a plan in which class r takes strategy i costs at least
    ``bound + reduced[r][i]`` (inf where i cannot be chosen). ``lam`` is the memory
    multiplier in microseconds per MiB (0 without a binding budget); ``sweeps`` the
    forward-and-backward sweeps it took. ``theta`` and ``phi`` are the class and edge
    potentials (inf where nothing can be chosen; an edge's read by row, column or whole,
    :class:`~autoplan.ilp.bound.dual_layout.Potentials`), ``a`` and ``b`` each edge's
    messages at its source and destination, all indexed like the problem's own arrays;
    ``low[k]`` is min φ_k and ``margin[k]`` φ_k's minimum over each source group's row
    and each destination group's column, less ``low[k]``.
    """

    bound: float
    reduced: dict[str, np.ndarray]
    lam: float
    sweeps: int
    theta: dict[str, np.ndarray]
    phi: list[Potentials]
    a: list[np.ndarray]
    b: list[np.ndarray]
    low: list[float]
    margin: list[tuple[np.ndarray, np.ndarray]]


class _Ascent:
    """The dual's state: class potentials θ, compact edge potentials φ and the messages."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        # perf_counter time at which sweeping stops (the user's time_limit_s), and whether it
        # did: a bound cut by the clock is valid but not reproducible
        self.deadline: float | None = None
        self.out_of_time = False
        self.names = list(p.linear)
        pos = {r: n for n, r in enumerate(self.names)}
        self.lam = 0.0
        # θ is views into one flat buffer: its part of the bound is one reduceat call and a
        # snapshot one copy. φ is not stored (dual_layout.End): a snapshot is θ and the
        # messages, and a visit reads each edge's prices once, writing nothing of its size.
        self._theta, cuts = flat([p.linear[r].astype(np.float64) for r in self.names])
        self.theta = dict(zip(self.names, cuts, strict=True))
        self._theta_starts = starts(cuts)
        self.pairs: list[tuple[End, End]] = []
        settles = True
        self.ends: dict[str, list[End]] = {r: [] for r in self.names}
        for e in p.edges:
            s = End(len(self.pairs), 0, e.src_group, p.allowed(e.src))
            d = End(len(self.pairs), 1, e.dst_group, p.allowed(e.dst))
            whole = len(s.present) == e.cost.shape[0] and len(d.present) == e.cost.shape[1]
            count = mode_blocks(p, e.src, e.dst)
            if whole and isinstance(e.cost, BlockDiagonal) and len(e.cost.blocks) == count:
                blocks = np.stack(e.cost.blocks)
            else:  # read, not written; rounded once the blocks are cut (a third of a moded edge)
                mat = np.asarray(e.cost) if whole else e.cost[np.ix_(s.present, d.present)]
                blocks = diagonal_blocks(mat, count)
            prices = rounded_down(e.scaled(blocks))
            finite = np.isfinite(prices)
            s.attach(prices, d, e.cost.shape[0], pos[e.dst], finite)
            d.attach(prices, s, e.cost.shape[1], pos[e.src], finite)
            # an edge with no finite price keeps the state unsettled (its least potential
            # is inf)
            settles = settles and bool(finite.any())
            self.pairs.append((s, d))
            self.ends[e.src].append(s)
            self.ends[e.dst].append(d)
        # whether the last change was a sweep, whose last visits leave every edge's least
        # potential at 0 (up to rounding): its bound then reads θ alone
        self._settled = False
        self._can_settle = settles
        self.visits = {
            (r, forward): Visit(ends, [(end.other > pos[r]) == forward for end in ends])
            for r, ends in self.ends.items()
            for forward in (True, False)
        }
        # per class, whether its visits take their edges' minima on threads
        self._threaded = {
            r: len(ends) > 1 and sum(end.edge.size for end in ends) >= _THREADED_PRICES
            for r, ends in self.ends.items()
        }
        self._pool: ThreadPoolExecutor | None = None
        for r, ends in self.ends.items():
            for end in ends:
                self.theta[r][end.bad] = np.inf

    def set_lam(self, lam: float) -> None:
        for r, mem in self.p.memory.items():
            self.theta[r] += (lam - self.lam) * mem / MEMORY_UNIT
        self.lam = lam

    def bound(self) -> float:
        low = np.minimum.reduceat
        # summed in Python, left to right, as one float per class and per edge
        total = sum(low(self._theta, self._theta_starts).tolist())
        for s, _ in () if self._settled else self.pairs:  # each edge's least potential
            rows = s.row_minima()
            if rows.size:
                total += float(rows.min())
        if self.lam and self.p.budget is not None:
            total -= self.lam * self.p.budget / MEMORY_UNIT
        return total

    def _visit(self, r: str, forward: bool) -> None:
        """Take in every edge's row minima at class r (each edge's minimum becomes 0), then
        hand an equal share of what lies above r's minimum back to the edges ahead. Each
        edge's potentials and message change once, by what it gave less what it got back."""
        plan = self.visits[r, forward]
        ends = plan.ends
        if not ends:
            return
        pool = self._pool if self._threaded[r] else None
        found = list(pool.map(End.row_minima, ends)) if pool else [e.row_minima() for e in ends]
        gave = [
            np.where(np.isfinite(c), c, 0.0) if end.guard else c
            for end, c in zip(ends, found, strict=True)
        ]
        t = self.theta[r]
        if len(ends) == 1:
            t += gave[0][plan.local]
        else:
            t += np.add.reduce(np.concatenate(gave)[plan.local], axis=0)
        if plan.order is not None:
            above = t - np.minimum.reduce(t)
            nu = plan.share * np.minimum.reduceat(above[plan.order], plan.starts)
            t -= np.add.reduce(nu[plan.back], axis=0) if plan.back.ndim == 2 else nu[plan.back]
            for k, lo, hi in plan.ahead:
                gave[k] = gave[k] - nu[lo:hi]
        for end, c in zip(ends, gave, strict=True):
            end.take(c)

    def converge(self, rise: float = ASCENT_CONVERGED_SEARCH, reach: float = -math.inf) -> int:
        """Sweep until a sweep raises the bound by less than ``rise`` of it, or until the
        bound can no longer get to ``reach`` in the sweeps left at the last sweep's rise;
        returns the sweeps made."""
        with self._threads():
            return self._converge(rise, reach)

    @contextmanager
    def _threads(self) -> Iterator[None]:
        """Worker threads for the visits of large classes while sweeps run, shut down after."""
        if _WORKERS < 2 or not any(self._threaded.values()) or self._pool is not None:
            yield
            return
        with ThreadPoolExecutor(_WORKERS) as pool:
            self._pool = pool
            try:
                yield
            finally:
                self._pool = None

    def _converge(self, rise: float, reach: float) -> int:
        last = self.bound()
        for n in range(1, _MAX_SWEEPS + 1):
            self.sweep()
            now = self.bound()
            if not math.isfinite(now) or now - last <= rise * max(1.0, abs(now)):
                return n  # an infinite bound: some edge has no possible move
            if self.past_deadline():
                return n  # out of time: the bound so far is as valid
            # a sweep's rise shrinks as the sweeps settle: a bound this far below the
            # mark, rising this slowly, stays below it
            if now + (_MAX_SWEEPS - n) * (now - last) < reach:
                return n
            last = now
        return _MAX_SWEEPS

    def seed(self, dual: Dual, other: Problem) -> None:
        """Start from the messages and multiplier of ``dual``, an ascent on ``other``, a
        problem built from the same cost table (:func:`~autoplan.ilp.bound.dual_seed.seed_messages`
        says which edge takes which). Any messages give a valid bound; these give a
        restriction of ``other`` at least the bound they gave it, and an untied copy of a
        tied model nearly that."""
        self.set_lam(dual.lam)
        self._settled = False
        for cls, end, c in seed_messages(self.p, self.pairs, dual.a, dual.b, other):
            self.theta[cls] += c[end.local]
            end.take(c)

    def past_deadline(self) -> bool:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.out_of_time = True
        return self.out_of_time

    def snapshot(self) -> tuple:
        msgs = [(s.msg.copy(), d.msg.copy()) for s, d in self.pairs]
        return self.lam, self._theta.copy(), msgs

    def restore(self, snap: tuple) -> None:
        """Back to a snapshot, in place (the ends hold views of the arrays)."""
        self.lam, theta, msgs = snap
        self._settled = False
        np.copyto(self._theta, theta)
        for k, (s, d) in enumerate(self.pairs):
            np.copyto(s.msg, msgs[k][0])
            np.copyto(d.msg, msgs[k][1])

    def sweep(self) -> None:
        """Visit every class forward, then backward. An edge's last visit is at its end
        first in the classes' order, where the edge is behind: it gives up its row minima
        and gets nothing back, so its least potential is 0 after the sweep."""
        for r in self.names:
            self._visit(r, True)
        for r in reversed(self.names):
            self._visit(r, False)
        self._settled = self._can_settle


class Ascent:
    """Dual ascent on one problem: :meth:`raise_bound` first (or from ``warm``, the state
    of an ascent on the same problem under another budget, or from ``seed``, the result
    of one on another problem of the same cost table and that problem), :meth:`refine` at
    a known memory multiplier after, :meth:`result` at any point."""

    def __init__(
        self,
        p: Problem,
        *,
        time_limit_s: float | None = None,
        warm: Warm | None = None,
        seed: tuple[Dual, Problem] | None = None,
    ) -> None:
        self._st = _Ascent(p)
        if time_limit_s is not None:
            self._st.deadline = time.perf_counter() + time_limit_s
        self.sweeps = 0
        # (multiplier, rise) of refinements not kept since the state last changed: the same
        # one again from the same state is the same sweeps to the same end
        self._not_kept: set[tuple[float, float]] = set()
        self.warmed = warm is not None and warm_fits(self._st.snapshot(), warm.snapshot)
        if warm is not None and self.warmed:
            self._st.restore(warm.snapshot)
        elif seed is not None:
            self._st.seed(*seed)

    def raise_bound(self, enough: float = math.inf, lam: float | None = None) -> None:
        """Sweeps and, under a budget that can bind, a search for λ (to about 1 %), then
        sweeps at ``lam`` too when given (where an ascent on a nearly equal problem ended:
        the search stops on the messages' own λ, which can be far from the LP's), kept
        only if the bound rises; from a warm start, sweeps at its multiplier only (the
        refinement then moves it). Stops once the bound reaches ``enough`` (the caller
        only needs to know it does)."""
        self._not_kept.clear()
        self.sweeps += self._st.converge()
        if budget_can_bind(self._st.p) and not self.warmed and self._st.bound() < enough:
            self.sweeps += search_lam(self._st, enough)
            if lam is not None and self._st.bound() < enough:
                self.refine(lam, ASCENT_CONVERGED_SEARCH)

    def warm(self) -> Warm:
        """The state to start an ascent on this problem under another budget from."""
        return Warm(self._st.snapshot(), self._st.lam)

    def refine(self, lam: float, rise: float = ASCENT_CONVERGED_REFINE) -> bool:
        """Sweep at multiplier ``lam`` (e.g. the LP's) until a sweep raises the bound by
        less than ``rise`` of it, or it can no longer pass the bound it started from
        (:meth:`_Ascent.converge`); kept only if the bound rises, which the return value
        says. The same refinement again, from a state it was not kept in, is not swept
        again."""
        st = self._st
        if (lam, rise) in self._not_kept:
            return False
        before, snap = st.bound(), st.snapshot()
        st.set_lam(lam)
        self.sweeps += st.converge(rise, reach=before)
        if st.bound() > before:
            self._not_kept.clear()
            return True
        st.restore(snap)
        self._not_kept.add((lam, rise))
        return False

    def result(self) -> Dual:
        return _finish(self._st, self.sweeps)

    @property
    def out_of_time(self) -> bool:
        """Whether the time limit stopped the sweeps (the bound is valid, but another run
        could reach another one)."""
        return self._st.out_of_time


def ascend(p: Problem) -> Dual:
    """The bound of :meth:`Ascent.raise_bound` on ``p``."""
    ascent = Ascent(p)
    ascent.raise_bound()
    return ascent.result()


def _finish(st: _Ascent, sweeps: int) -> Dual:
    """The bound and reduced costs recomputed from the messages alone (no rounding
    carried over from the sweeps)."""
    p, lam = st.p, st.lam
    theta = {r: p.linear[r].astype(np.float64).copy() for r in st.names}
    for r, mem in p.memory.items():
        theta[r] += lam * mem / MEMORY_UNIT
    a = [s.full_message() for s, _ in st.pairs]
    b = [d.full_message() for _, d in st.pairs]
    phi = [Potentials(s, d) for s, d in st.pairs]
    for r, ends in st.ends.items():
        for end in ends:
            msg = a[end.k] if end.axis == 0 else b[end.k]
            theta[r] = theta[r] + msg[end.safe]
            theta[r][end.bad] = np.inf
    least = np.minimum.reduce
    lows = {r: float(least(t)) for r, t in theta.items()}
    edge_low = [float(f.row_min.min(initial=np.inf)) for f in phi]
    bound = sum(lows.values()) + sum(edge_low)
    if lam and p.budget is not None:
        bound -= lam * p.budget / MEMORY_UNIT
    with np.errstate(invalid="ignore"):  # inf - inf where no plan exists at all
        margin = [(f.row_min - low, f.col_min - low) for f, low in zip(phi, edge_low, strict=True)]
        reduced = {r: theta[r] - lows[r] for r in st.names}
        for r, ends in st.ends.items():
            for end in ends:
                rows = margin[end.k][end.axis]
                reduced[r] = reduced[r] + np.where(end.group >= 0, rows[end.safe], 0.0)
    reduced = {r: np.where(np.isnan(v), 0.0, v) for r, v in reduced.items()}
    return Dual(bound, reduced, lam, sweeps, theta, phi, a, b, edge_low, margin)
