"""The runtime: a plan applied to a model that trains on a real mesh (stage 7).

In: a :class:`~autoplan.result.plan.Plan`, the model and a ``DeviceMesh``. Out: a
parallelized module (:func:`autoplan.parallelize`, :mod:`~autoplan.runtime.apply`) whose
call runs lowered programs of local ops and collectives
(:mod:`~autoplan.runtime.planned_module`, :mod:`~autoplan.runtime.lower`,
:mod:`~autoplan.runtime.execute`), with parameter-side collectives merged
(:mod:`~autoplan.runtime.bucket_program`), views folded, buffers released, and
checkpoints saved and loaded under any plan (:mod:`~autoplan.runtime.checkpoint`).

May import: every folder below it, the planner included (a checkpoint agrees on its
rank-0 decisions through :mod:`autoplan.planner.job`); never the tools.
"""
