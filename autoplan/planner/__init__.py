"""The planner: a model, its inputs and a mesh -> a :class:`~autoplan.result.plan.Plan`.

In: the user's model, ``input_fn``, mesh and :class:`~autoplan.core.config.PlanConfig`.
Out: a plan. :mod:`~autoplan.planner.pipeline` runs the stages in one call
(:func:`autoplan.plan`); :mod:`~autoplan.planner.front_end` runs those before the solver
once for every tool; :mod:`~autoplan.planner.solve_mode` solves one checkpointing mode,
:mod:`~autoplan.planner.readout` turns the solution into the plan's fields,
:mod:`~autoplan.planner.transient` re-solves a plan whose transient peak is over budget,
:mod:`~autoplan.planner.job` plans inside a distributed job (one rank plans, all get it).

May import: every stage below it (core, models, trace, rewrite, strategies, cost, ilp,
memory, result); never the runtime or the tools.
"""
