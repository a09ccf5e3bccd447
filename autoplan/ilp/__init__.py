"""Stage 5, the ILP: a priced strategy table -> one strategy per node, in five steps.

Input: the strategy table and its cost table, the placement constraints and the memory
budget. Output: a strategy per node, its estimated step time and a proven bound. Why
five sub-packages: each step has one job and reads only what the steps before it
made, so the run order below is also the import order.

Run order, one sub-package each:

* 5a :mod:`~autoplan.ilp.reductions`: merge follower nodes, tie repeated layers;
* 5b :mod:`~autoplan.ilp.formulation`: the ILP as numpy arrays, simplified and pruned;
* 5c :mod:`~autoplan.ilp.bound`: a lower bound, column prices and a first plan;
* 5d :mod:`~autoplan.ilp.untying`: let repeated layers differ under a binding budget;
* 5e :mod:`~autoplan.ilp.solver`: the MIP, and :func:`~autoplan.ilp.solver.stage.solve_ilp`,
  which runs 5c to 5e.

:mod:`~autoplan.ilp.tolerances` holds the numeric tolerances they share,
:mod:`~autoplan.ilp.scratch` the buffer their passes over many matrices reuse, and
:mod:`~autoplan.ilp.backends` the solvers (CBC, HiGHS) that the bound's LP and the MIP
both run, with :mod:`~autoplan.ilp.owned_process` owning CBC's child process.

May import: :mod:`autoplan.core` and :mod:`autoplan.cost` (the cost table it is built
from); nothing of the memory model, the planner or later.
"""
