"""The result: a :class:`~autoplan.result.plan.Plan` (the solution, its report and its
provenance) and its JSON form, read back with every field checked
(:mod:`~autoplan.result.plan_check`).

In: what the planner read out of a solve, or a saved plan file. Out: the plan every
tool and the runtime read.

May import: :mod:`autoplan.core` alone (a saved plan loads without the planner).
"""
