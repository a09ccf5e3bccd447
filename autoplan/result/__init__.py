"""The result: a :class:`~autoplan.result.plan.Plan` (the solution, its report and its
provenance) of typed records (:mod:`~autoplan.result.records`), and its JSON form,
written and read by one codec walking those types (:data:`~autoplan.result.records.CODEC`)
and checked across fields at the load (:mod:`~autoplan.result.plan_check`).

In: what the planner read out of a solve, or a saved plan file. Out: the plan every
tool and the runtime read.

May import: :mod:`autoplan.core` alone (a saved plan loads without the planner).
"""
