"""The ILP stage's numeric tolerances, one name per decision.

Input: none. Output: constants that every step of the ILP stage reads. Why one module: a
threshold written as a literal in several files drifts apart; here each constant says
what it decides, and modules that decide the same thing share it.
"""

from __future__ import annotations

LP_USED = 1e-6
"""An LP value above this counts as "the LP uses this strategy" (rounding a relaxation
to a plan, mixing layers, narrowing the untied ILP): smaller values are solver noise."""

LP_NONZERO = 1e-9
"""An LP column value above this keeps the column in a restricted MIP (reduced-cost
fixing, the polish): a column the LP touches at all is never fixed to 0."""

GAP_NOISE = 1e-6
"""A gap between a plan and the bound within this share of the plan's cost is rounding
and LP tolerance: fixing widens the gap by it, and the polish treats such a gap as closed."""

ROUNDING_RTOL = 1e-9
"""Two sums of prices (or of bytes) closer than this share of their size are equal:
what separates them is float rounding (a move that improves, a plan that is cheaper,
an arc on a cheapest route, a footprint within the budget)."""

BUDGET_BINDS = 1e-6
"""The LP's memory row binds when the LP uses all but this share of the budget: only
then can untying the repeated layers pay."""

ADDITIVE_RTOL = 1e-12
"""Relative tolerance for recognising an edge's prices as ``a[r] + b[c]`` (then folded into
its ends): far below any price difference that matters."""

TIE_DECIMALS = 6
"""Prices are rounded to this many decimals before they are hashed for layer tying, so
that the same price summed in another order still ties."""

ASCENT_CONVERGED_SEARCH = 1e-4
"""Dual ascent stops sweeping when a forward-and-backward sweep raises the bound by less
than this share of it, while the memory multiplier is searched (any bound is valid)."""

ASCENT_CONVERGED_REFINE = 1e-5
"""The same, once the multiplier is the LP's: this bound prices the columns the MIP keeps."""

LAMBDA_FOUND = 1e-2
"""The memory multiplier's secant search stops when the multiplier best for the settled
messages is within this share of the one tried: the LP's own multiplier refines it after."""

LAMBDA_BISECTED = 1e-12
"""The bisection for the best multiplier with the messages held stops when its bracket is
this narrow relative to its upper end: float precision, no further bound to gain."""

MODES_MIXED = 1e-2
"""The LP mixes a layer group's checkpointing modes when it leaves more than this share of
a class outside its most used mode: the mode branching then splits the group. A smaller
share moves the bound by at most that share of what the modes' plans differ, and is left
to the MIP (tiny LLaMA, 4 layers under 0.004 GiB: branching on LPs that left 2.8e-4 took
the untie pass's tree from a handful of nodes to 19 and 55 s)."""
