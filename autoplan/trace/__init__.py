"""Stage 1, trace: a model and its example inputs -> the joint forward+backward graph.

In: an ``nn.Module`` (usually on the meta device) and its inputs as fake tensors.
Out: a :class:`~autoplan.trace.capture.TracedGraph` (the aten graph, its parameters,
gradients and outputs). :mod:`~autoplan.trace.forward_checks` checks what the traced
forward receives and returns, each failure with its fix; a deep stack of alike layers
(:mod:`~autoplan.trace.layers`) is traced as four and stamped to its depth
(:mod:`~autoplan.trace.stamp`).

May import: :mod:`autoplan.core` and :mod:`autoplan.models`.
"""
