"""Stage 5b, formulation: the ILP whose optimum is the plan, as solver-ready arrays.

Input: the reduced cost table, the tie map, the allowed strategies and a memory budget.
Output: an :class:`~autoplan.ilp.formulation.build.IlpModel`. Order: :mod:`.problem`
sums tied nodes into classes and simplifies exactly, :mod:`.prune` drops dominated
strategies, :mod:`.matrix` lays the result out as arrays, and :mod:`.build` runs the
three (its docstring holds the ILP's math). Why arrays: every reduction is a few numpy
operations, and the same arrays go to either solver.
"""
