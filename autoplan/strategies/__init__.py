"""Stage 3, strategies: what each node of the traced graph may do on the mesh.

In: a rewritten :class:`~autoplan.trace.capture.TracedGraph` and the mesh shape. Out: a
:class:`~autoplan.strategies.table.StrategyTable`, the candidate placements of every
node's output and inputs (:mod:`~autoplan.strategies.enumerate`, from DTensor's own
rules through :mod:`autoplan.core.torch_adapter`), and the user's input, output and
parameter pins as masks over them (:mod:`~autoplan.strategies.constraints`).

May import: :mod:`autoplan.core`, :mod:`autoplan.trace` and :mod:`autoplan.rewrite`.
"""
