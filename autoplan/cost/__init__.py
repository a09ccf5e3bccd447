"""Stage 4, cost: every strategy and every edge of a strategy table, priced.

In: the strategy table, the traced graph and a :class:`~autoplan.core.topology.Topology`.
Out: a :class:`~autoplan.cost.price.CostTable`: each strategy's compute time (a FLOP
roofline, :mod:`~autoplan.cost.compute`), each edge's redistribution time (NCCL-style
collectives, :mod:`~autoplan.cost.collectives`, over the cheapest route of DTensor moves,
:mod:`~autoplan.cost.routes`) and each strategy's memory; :mod:`~autoplan.cost.buckets`
prices the moves a chosen plan runs merged.

May import: :mod:`autoplan.core`, :mod:`autoplan.trace` and :mod:`autoplan.strategies`.
"""
