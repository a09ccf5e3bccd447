"""Stage 5c, bound: a lower bound on every plan, a price per column and a first plan.

Input: an :class:`~autoplan.ilp.formulation.build.IlpModel`. Output: a
:class:`~autoplan.ilp.bound.relax.Relaxation`. Order: :mod:`.dual` raises the bound by
dual ascent (over the layout of :mod:`.dual_layout`, the memory multiplier from
:mod:`.memory_price`, started from a related problem's messages by :mod:`.dual_seed`),
:mod:`.dual_prices` prices the columns and decodes a plan,
:mod:`.incumbent` makes it feasible, and :mod:`.relax` runs them with a small LP. Why:
the MIP drops every column priced above the incumbent's gap, and the untie step reads
the LP's strategies.
"""
