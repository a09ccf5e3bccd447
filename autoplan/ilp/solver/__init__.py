"""Stage 5e, solve: the MIP over the tied model, and the ILP stage's entry point.

Input: an :class:`~autoplan.ilp.formulation.build.IlpModel` (and the cost table it was
built from, for untying). Output: a :class:`~autoplan.ilp.solver.solve.Solution`.
:mod:`.stage` (:func:`~autoplan.ilp.solver.stage.solve_ilp`) runs the bound, the untie
step and :mod:`.solve`'s MIP in that order; :mod:`autoplan.ilp.backends` hands the
arrays to CBC or HiGHS. Why last: the MIP proves the plan, and the steps before it make its model
small (the bound fixes columns, the untied plan is its cutoff).
"""
