"""Stage 7, lower: the planned joint graph to one graph of local ops on this rank.

Input: a :class:`~autoplan.execute.PlannedGraph` (the traced joint graph with the plan's
placement for every tensor) and this rank's parameters, buffers and inputs as DTensors
on the real mesh. Output: a :class:`LoweredStep`, an ``fx.GraphModule`` over the local
shards made of aten ops and the functional collectives (``_c10d_functional``) of every
redistribution the plan priced, hop by hop along its routes, returning the loss and
each parameter's gradient shard.

Why: ``PlannedGraph`` runs every op through DTensor, so sharding propagation,
redistribute planning and DTensor's dispatch were paid per op at every step, although
they decide the same thing each time. Here they run once: ``make_fx`` records one
planned execution on fake local tensors (no compute, no communication), and every step
then runs the recorded local ops, eagerly or through ``torch.compile``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import torch
from torch import fx
from torch.distributed.tensor import DTensor, Replicate
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.execute import PlannedGraph, collective_counts
from autoplan.placements import fmt
from autoplan.strategies.dtensor import isolated_trace

__all__ = ["LoweredStep", "defer_waits", "lower"]

_WAIT = torch.ops._c10d_functional.wait_tensor.default


class LoweredStep:
    """One training step of a plan on this rank, as local ops and functional collectives.

    ``gm`` takes the local shards of the parameters, buffers and inputs (in the traced
    graph's order) and returns ``[loss, *grads]``: the loss on this rank (replicated,
    so the same on every rank) and the gradient shard of each parameter in
    ``grad_fqns``, in its parameter's placement and dtype. ``names`` lists what each
    placeholder of ``gm`` stands for; ``deviations`` the nodes where DTensor made another
    placement than planned while the step was recorded (moved to the planned one).
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        param_fqns: tuple[str, ...],
        grad_fqns: tuple[str, ...],
        names: tuple[str, ...],
        *,
        deviations: tuple[str, ...] = (),
        compile: bool = False,
    ) -> None:
        self.gm, self.param_fqns, self.grad_fqns, self.names = gm, param_fqns, grad_fqns, names
        self.deviations = deviations
        self._fn: Callable[..., list[torch.Tensor]] = torch.compile(gm) if compile else gm

    def run(
        self,
        params: Sequence[torch.Tensor],
        buffers: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and each gradient's local shard, keyed by parameter FQN."""
        out = self._fn(list(params), list(buffers), list(inputs))
        return out[0], dict(zip(self.grad_fqns, out[1:], strict=True))

    def collectives(self) -> dict[str, int]:
        """How many collectives of each kind one step runs, in ``plan.comm``'s vocabulary."""
        ops = Counter(
            node.target.overloadpacket
            for node in self.gm.graph.nodes
            if getattr(node.target, "namespace", None) == "_c10d_functional"
            and node.target is not _WAIT
        )
        return collective_counts(ops)

    def __str__(self) -> str:
        header = [
            f"# {p.name}: {what}" for p, what in zip(self._placeholders(), self.names, strict=True)
        ]
        return "\n".join(header) + "\n" + self.gm.code

    def _placeholders(self) -> list[fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]


def lower(
    graph: PlannedGraph,
    params: Sequence[DTensor],
    buffers: Sequence[DTensor],
    inputs: Sequence[DTensor],
    *,
    param_dtype: torch.dtype | None = None,
    compile: bool = False,
) -> LoweredStep:
    """Record one planned step of ``graph`` on ``params``, ``buffers`` and ``inputs``.

    Every rank must call it together (its DTensor ops build the same collectives on
    each rank, though none runs). ``param_dtype`` computes with the parameters cast to
    it while gradients come back in each parameter's own dtype (FSDP2's mixed
    precision).
    """
    t = graph.traced
    grad_fqns = tuple(f for f in t.param_fqns if f in t.grads)
    mesh = graph.mesh

    def wrap(local: Sequence[torch.Tensor], like: Sequence[DTensor]) -> list[DTensor]:
        return [
            DTensor.from_local(
                x, mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride()
            )
            for x, d in zip(local, like, strict=True)
        ]

    def step(
        ps: list[torch.Tensor], bs: list[torch.Tensor], xs: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        placed = wrap(ps, params)
        if param_dtype is not None:
            placed = [p.to(param_dtype) if p.is_floating_point() else p for p in placed]
        loss, grads = graph.run(placed, wrap(bs, buffers), wrap(xs, inputs))
        if all(isinstance(p, Replicate) for p in loss.placements):
            loss_local = loss.to_local()
        else:  # not priced: plan with output_placements=["R..."] to avoid it
            loss_local = loss.full_tensor()
        dtypes = {f: p.dtype for f, p in zip(t.param_fqns, params, strict=True)}
        return [loss_local] + [grads[f].to(dtypes[f]).to_local() for f in grad_fqns]

    local = [[x.to_local() for x in group] for group in (params, buffers, inputs)]
    with isolated_trace(), torch.no_grad():
        gm = make_fx(step, tracing_mode="fake")(*local)
    gm.graph.eliminate_dead_code()
    defer_waits(gm.graph)
    gm.recompile()
    names = tuple(
        [f"parameter {f} {fmt(p.placements)}" for f, p in zip(t.param_fqns, params, strict=True)]
        + [f"buffer {f}" for f in t.buffer_fqns]
        + [f"input {i} {fmt(x.placements)}" for i, x in enumerate(inputs)]
    )
    return LoweredStep(
        gm, t.param_fqns, grad_fqns, names, deviations=tuple(graph.deviations), compile=compile
    )


def defer_waits(graph: fx.Graph) -> int:
    """Move each collective's wait to just before the first node that reads its result.

    A functional collective starts when issued and ``wait_tensor`` blocks until it is
    done; traced, each wait follows its collective at once, so nothing overlaps. Waiting
    only where the result is needed lets the collective run while the ops between go on
    (a gradient's reduction under the rest of the backward, as DDP's buckets do). The
    order of the collectives themselves is unchanged: every rank issues them alike.
    Returns how many waits moved.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}
    moved = 0
    for wait in [n for n in graph.nodes if n.target is _WAIT]:
        first = min(wait.users, key=order.__getitem__, default=None)
        if first is not None and order[first] > order[wait] + 1:
            first.prepend(wait)
            moved += 1
    return moved
