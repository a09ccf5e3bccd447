"""Stage 7, lower: the planned joint graph to a forward and a backward program of local ops.

Input: a :class:`~autoplan.runtime.execute.PlannedGraph` (the traced joint graph with the plan's
placement for every tensor) and this rank's parameters, buffers and inputs as DTensors
on the real mesh. Output: a :class:`LoweredStep`: ``fx.GraphModule`` s over the local
shards made of aten ops and the functional collectives (``_c10d_functional``) of every
redistribution the plan priced, hop by hop along its routes. The forward program
returns the model's output shards and the values the backward reads (the saved
activations); the backward program takes those and the output cotangents and returns
each parameter's gradient shard; the inference program is the forward alone.

Why: ``PlannedGraph`` runs every op through DTensor, so sharding propagation,
redistribute planning and DTensor's dispatch would be paid per op at every step,
although they decide the same thing each time. Here they run once: ``make_fx`` records
one planned execution on fake local tensors (no compute, no communication), torch's own
partitioner splits it where the forward ends (:mod:`autoplan.runtime.split_step`), and every step
runs the recorded local ops, eagerly or through ``torch.compile``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import fx
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.core.placements import Placements, cotangent_placements, fmt
from autoplan.core.torch_adapter import isolated_trace, rank_local_shape
from autoplan.runtime.bucket_program import (
    Bucket,
    bucket_collectives,
    impure_except_collectives,
    param_derived,
)
from autoplan.runtime.execute import PlannedGraph, collective_counts
from autoplan.runtime.fold_views import fold_views
from autoplan.runtime.release import Keeper, hold_collectives
from autoplan.runtime.split_step import (
    SavedValue,
    collective_ops,
    forward_only,
    placeholders,
    saved_values,
    split_joint,
)

__all__ = ["CommCounter", "LoweredStep", "OutputSpec", "defer_waits", "lower"]

_WAIT = torch.ops._c10d_functional.wait_tensor.default


class CommCounter(CommDebugMode):
    """torch's ``CommDebugMode``, also counting the in-place all-reduce a lowered step's
    gradient buckets run on their own flat buffer (torch's list has the out-of-place
    functional collectives only). ``collective_counts(c.get_comm_counts())`` then gives
    what a step ran in ``plan.comm``'s vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.comm_registry.add(torch.ops._c10d_functional.all_reduce_)


@dataclass(frozen=True)
class OutputSpec:
    """One output tensor of the model: its planned placement and global size."""

    placements: Placements
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    differentiable: bool


class LoweredStep:
    """One training step of a plan on this rank, as local ops and functional collectives.

    ``forward`` takes the local shards of the parameters, buffers and inputs (in the
    traced graph's order, ``names``) and returns the output shards (placed as
    ``outputs`` say) followed by ``saved``; ``backward`` takes the saved values and
    each differentiable output's cotangent shard (placed as it arrives,
    :func:`~autoplan.core.placements.cotangent_placements`) and returns the gradient shard of each
    parameter in ``grad_fqns``, in its parameter's placement and dtype; ``inference``
    is the forward without anything saved. ``deviations`` lists the nodes where
    DTensor made another placement than planned while the step was recorded (moved to
    the planned one).
    """

    def __init__(
        self,
        forward: fx.GraphModule,
        backward: fx.GraphModule,
        inference: fx.GraphModule,
        *,
        param_fqns: tuple[str, ...],
        grad_fqns: tuple[str, ...],
        names: tuple[str, ...],
        outputs: tuple[OutputSpec, ...],
        saved: tuple[SavedValue, ...],
        backward_inputs: tuple[int, ...],
        deviations: tuple[str, ...] = (),
        buckets: tuple[Bucket, ...] = (),
        compile: bool = False,
    ) -> None:
        self.forward, self.backward, self.inference = forward, backward, inference
        self.param_fqns, self.grad_fqns, self.names = param_fqns, grad_fqns, names
        self.outputs, self.saved, self.deviations = outputs, saved, deviations
        self.buckets = buckets
        # per backward placeholder: its index in saved, or -1 - k for the k-th cotangent
        self._backward_inputs = backward_inputs
        # an eager call returns only once gloo's worker threads have let go of the buffers
        # its collectives held (autoplan.runtime.release: a worker left holding one at exit can
        # abort the process); compiled, the buffers are Inductor's and this holds none
        # (holding them would break the compiled graph at every collective: docs/apply.md)
        self._keeper = Keeper()
        # eager: the generated code itself, not the module call, so module hooks and
        # trackers (CommDebugMode's) never see a module that runs inside a backward
        wrap: Callable[[fx.GraphModule], Callable[..., list[torch.Tensor]]] = (
            torch.compile if compile else (lambda gm: hold_collectives(gm, self._keeper).forward)
        )
        self._fwd, self._bwd, self._inf = wrap(forward), wrap(backward), wrap(inference)

    @property
    def tangent_placements(self) -> tuple[Placements, ...]:
        """Where each differentiable output's cotangent is expected to arrive."""
        return tuple(cotangent_placements(o.placements) for o in self.outputs if o.differentiable)

    @property
    def activation_bytes(self) -> int:
        """Bytes per rank the forward keeps for the backward beyond its own inputs."""
        return sum(s.nbytes for s in self.saved if s.what == "activation")

    def run_forward(
        self, primals: Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The output shards and the saved values."""
        out = self._fwd(*primals)
        self._keeper.settle()
        n = len(self.outputs)
        return list(out[:n]), list(out[n:])

    def run_backward(
        self, saved: Sequence[torch.Tensor], tangents: Sequence[torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Each gradient's local shard, keyed by parameter FQN."""
        args = [saved[i] if i >= 0 else tangents[-1 - i] for i in self._backward_inputs]
        grads = self._bwd(*args)
        self._keeper.settle()
        return dict(zip(self.grad_fqns, grads, strict=True))

    def run_inference(self, primals: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The output shards, nothing saved."""
        out = list(self._inf(*primals))
        self._keeper.settle()
        return out

    def collectives(self) -> dict[str, int]:
        """How many collectives of each kind a training step (forward and backward) runs,
        in ``plan.comm``'s vocabulary."""
        return collective_counts(collective_ops(self.forward) + collective_ops(self.backward))

    def unbucketed_collectives(self) -> dict[str, int]:
        """The collectives of a step before bucketing: one per planned move, as priced."""
        out = self.collectives()
        for b in self.buckets:
            out[b.kind] += b.members - 1
        return out

    def __str__(self) -> str:
        legend = [
            f"# {p.name}: {what}"
            for p, what in zip(placeholders(self.forward), self.names, strict=True)
        ]
        saved = [
            f"# saved {s.name}: {s.what} {list(s.shape)} {str(s.dtype).removeprefix('torch.')}"
            for s in self.saved
        ]
        return "\n".join(
            ["# forward", *legend, self.forward.code, "# backward", *saved, self.backward.code]
        )


def lower(
    graph: PlannedGraph,
    params: Sequence[DTensor],
    buffers: Sequence[DTensor],
    inputs: Sequence[DTensor],
    *,
    param_dtype: torch.dtype | None = None,
    bucket_bytes: int = 0,
    compile: bool = False,
) -> LoweredStep:
    """Record one planned step of ``graph`` on ``params``, ``buffers`` and ``inputs``, and
    split it into its forward and backward programs.

    Every rank must call it together (its DTensor ops build the same collectives on
    each rank, though none runs). ``param_dtype`` computes with the parameters cast to
    it while gradients come back in each parameter's own dtype (FSDP2's mixed
    precision). ``bucket_bytes`` caps the buckets parameter gathers and gradient
    reductions are merged into (:mod:`autoplan.runtime.bucket_program`; 0: one collective per move).
    """
    t = graph.traced
    grad_fqns = tuple(f for f in t.param_fqns if f in t.grads)
    mesh = graph.mesh
    outputs = tuple(_output_spec(graph, i) for i in range(len(t.outputs)))
    tangent_specs = [(i, cotangent_placements(outputs[i].placements)) for i in sorted(t.tangents)]
    primals_like = [*params, *buffers, *inputs]

    def wrap(local: torch.Tensor, like: DTensor) -> DTensor:
        return DTensor.from_local(
            local, mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
        )

    def joint(primals: list[torch.Tensor], tangents: list[torch.Tensor]) -> list[torch.Tensor]:
        placed = [wrap(x, d) for x, d in zip(primals, primals_like, strict=True)]
        ps, rest = placed[: len(params)], placed[len(params) :]
        if param_dtype is not None:
            ps = [_to_dtype(p, param_dtype) if p.is_floating_point() else p for p in ps]
        cotangents = [
            functools.partial(
                DTensor.from_local,
                x,
                mesh,
                where,
                run_check=False,
                shape=torch.Size(outputs[i].shape),
                stride=outputs[i].stride,
            )
            for x, (i, where) in zip(tangents, tangent_specs, strict=True)
        ]
        outs, grads = graph.run(ps, rest[: len(buffers)], rest[len(buffers) :], cotangents)
        dtypes = {f: p.dtype for f, p in zip(t.param_fqns, params, strict=True)}
        grads_out = [_to_dtype(grads[f], dtypes[f]).to_local() for f in grad_fqns]
        return [o.to_local() for o in outs] + grads_out

    local_primals = [x.to_local() for x in primals_like]
    local_tangents = [
        torch.empty(rank_local_shape(outputs[i].shape, mesh, where), dtype=outputs[i].dtype)
        for i, where in tangent_specs
    ]
    with isolated_trace(), torch.no_grad():
        gm = make_fx(joint, tracing_mode="fake")(local_primals, local_tangents)
    # a collective whose result nothing reads is dead here as in the split programs
    gm.graph.eliminate_dead_code(is_impure_node=impure_except_collectives)
    gm.recompile()
    forward, backward = split_joint(gm, len(outputs))
    names = tuple(
        [f"parameter {f} {fmt(p.placements)}" for f, p in zip(t.param_fqns, params, strict=True)]
        + [f"buffer {f}" for f in t.buffer_fqns]
        + [f"input {i} {fmt(x.placements)}" for i, x in enumerate(inputs)]
    )
    # matched by name before the passes below, which may replace a handed value
    # (a bucketed gather) by a node of another name in the same position
    saved, backward_inputs = saved_values(forward, backward, len(outputs), names)
    for program in (forward, backward):
        fold_views(program.graph)
    parameters = {p.name for p in placeholders(forward)[: len(params)]}
    # the backward's parameter-derived inputs: what the forward saves of its own
    derived = param_derived(forward.graph, parameters) & {p.name for p in placeholders(backward)}
    buckets = bucket_collectives(
        forward.graph, bucket_bytes, head_from=parameters, in_place=not compile
    )
    buckets += bucket_collectives(
        backward.graph, bucket_bytes, head_from=derived, tail=True, in_place=not compile
    )
    for program in (forward, backward):
        defer_waits(program.graph)
        program.recompile()
    inference = forward_only(forward, len(outputs))
    return LoweredStep(
        forward,
        backward,
        inference,
        param_fqns=t.param_fqns,
        grad_fqns=grad_fqns,
        names=names,
        outputs=outputs,
        saved=saved,
        backward_inputs=backward_inputs,
        deviations=tuple(graph.deviations),
        buckets=tuple(buckets),
        compile=compile,
    )


def _to_dtype(x: DTensor, dtype: torch.dtype) -> DTensor:
    out = x.to(dtype)
    assert isinstance(out, DTensor), "a DTensor's .to gives a DTensor"
    return out


def _output_spec(graph: PlannedGraph, index: int) -> OutputSpec:
    name = graph.traced.outputs[index]
    val = graph.traced.node(name).meta["val"]
    want = graph.planned_output(name)
    return OutputSpec(
        want, tuple(val.shape), tuple(val.stride()), val.dtype, index in graph.traced.tangents
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
