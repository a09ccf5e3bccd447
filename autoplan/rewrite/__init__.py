"""Stage 2, rewrite: graph passes between tracing and strategy enumeration.

Input: a :class:`~autoplan.trace.capture.TracedGraph` and the ``mm_mode``. Output: a
TracedGraph whose graph has been rewritten (``"einsum"``: nn.Linear's
``view -> mm -> view`` becomes ``einsum``) or left as traced (``"native"``).

May import: :mod:`autoplan.core` and :mod:`autoplan.trace`.
"""

from __future__ import annotations

import dataclasses

from autoplan.core.errors import PlanError
from autoplan.rewrite.einsum import RewriteStats, rewrite_linear_to_einsum
from autoplan.trace.capture import TracedGraph

__all__ = ["RewriteStats", "rewrite", "rewrite_linear_to_einsum"]


def rewrite(traced: TracedGraph, *, mm_mode: str) -> tuple[TracedGraph, RewriteStats]:
    """Apply the passes ``mm_mode`` asks for; the graph module is changed in place."""
    if mm_mode == "native":
        return traced, RewriteStats()
    if mm_mode != "einsum":
        raise PlanError(f"mm_mode ({mm_mode!r}) must be 'einsum' or 'native'.")
    stats = rewrite_linear_to_einsum(traced.gm)
    out = next(n for n in traced.gm.graph.nodes if n.op == "output")
    flat = list(out.args[0])  # [*outputs, *grads]: the rewrite may have replaced any of them
    n = len(traced.outputs)
    grads = {
        fqn: g.name for fqn, g in zip(traced.param_fqns, flat[n:], strict=True) if g is not None
    }
    outputs = tuple(o.name for o in flat[:n])
    return dataclasses.replace(traced, grads=grads, outputs=outputs), stats
