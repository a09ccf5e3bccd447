"""What a plan holds: activation memory, activation checkpointing and its modes.

In: the traced graph, its strategy table and cost table. Out: the activations each
strategy keeps (:mod:`~autoplan.memory.activations`), each layer's recomputation and
its price (:mod:`~autoplan.memory.recompute`), and the per-layer checkpointing modes as
strategies the ILP chooses among (:mod:`~autoplan.memory.layer_modes`).

May import: :mod:`autoplan.core`, :mod:`autoplan.trace`, :mod:`autoplan.strategies`,
:mod:`autoplan.cost` and :mod:`autoplan.ilp` (the mode blocks follow the ILP's merged
followers).
"""
