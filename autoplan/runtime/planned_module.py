"""Stage 7, the parallelized module's call: lowered programs per input shape, run by autograd.

Input: a module whose parameters ``autoplan.parallelize`` placed, the plan and the real
mesh. Output: the module's class swapped for a subclass (FSDP2's idiom) whose forward
takes the inputs (DTensors or each rank's local shards), runs the planned forward
program and returns the model's output, structured as the model returns it, as
DTensors in their planned placements (the loss, as a plain tensor, for a plan made with
a ``loss_fn``). A loss computed from it drives the planned backward program, which hands
every parameter its gradient in the parameter's own placement, so any ``torch.optim``
optimizer steps on the DTensors. Under ``torch.no_grad()`` or ``eval()`` the forward
runs alone and keeps nothing for a backward.

Why: at the first call for an input shape the joint graph is traced again on fake
tensors (as the planner traced it), checked against the plan's fingerprint (a plan
runs only on the graph it was made for: the same model, loss, shapes and dtypes), and
lowered once to local ops and functional collectives (:mod:`autoplan.runtime.lower`); every
later call runs those programs only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autoplan.core.config import DTYPES
from autoplan.core.errors import PlanError
from autoplan.core.graph import fingerprint
from autoplan.core.inputs import InputKey, call_form, label, match_call
from autoplan.core.placements import Placements, cotangent_placements, fmt, shard_degrees
from autoplan.core.torch_adapter import rank_local_shape
from autoplan.memory.recompute import with_recompute
from autoplan.result.plan import Plan
from autoplan.rewrite import rewrite
from autoplan.runtime.execute import PlannedGraph, op_name
from autoplan.runtime.lower import LoweredStep, OutputSpec, lower
from autoplan.trace.capture import LossFn, TracedGraph, trace_joint

__all__ = ["PlannedState", "install"]


class PlannedState:
    """What a parallelized module keeps: the plan, the mesh, a lowered step per input shape."""

    def __init__(
        self,
        plan: Plan,
        mesh: DeviceMesh,
        placements: Sequence[Placements],
        *,
        loss_fn: LossFn | None = None,
        bucket_bytes: int = 0,
        compile: bool = False,
    ) -> None:
        self.plan, self.mesh, self.placements = plan, mesh, list(placements)
        self.loss_fn, self.compile, self.bucket_bytes = loss_fn, compile, bucket_bytes
        cfg = plan.config
        self.mm_mode = cfg.get("mm_mode", "einsum")
        self.param_dtype = DTYPES[cfg["param_dtype"]] if cfg.get("param_dtype") else None
        self.stamp_layers = bool(cfg.get("stamp_layers", True))  # traced as the plan was
        self.reduce_dtype = DTYPES[cfg["reduce_dtype"]] if cfg.get("reduce_dtype") else None
        # plans saved before input keys were recorded took positional inputs only
        self.keys = plan.input_keys or tuple(range(len(self.placements)))
        self.steps: dict[tuple[Any, ...], LoweredStep] = {}
        self._traced: dict[tuple[Any, ...], TracedGraph] = {}

    def inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[DTensor, ...]:
        """A call's inputs as DTensors in the planned order and placements, checked against
        the planned keys and global shapes."""
        values = match_call(self.keys, args, kwargs)
        out = []
        planned = self.plan.input_shapes or (None,) * len(values)
        for key, x, want, shape in zip(self.keys, values, self.placements, planned, strict=True):
            out.append(self._placed(key, x, want))
            if shape is not None and tuple(out[-1].shape) != tuple(shape):
                raise PlanError(
                    f"{label(key)} has global shape {tuple(out[-1].shape)} (placed {fmt(want)} "
                    f"on mesh {tuple(self.mesh.shape)}) but the plan was made for "
                    f"{tuple(shape)}; pass each rank's shard of a batch of the planned shape, "
                    "or plan again."
                )
        return tuple(out)

    def _placed(self, key: InputKey, x: Any, want: Placements) -> DTensor:
        if isinstance(x, DTensor):
            return x if tuple(x.placements) == want else x.redistribute(self.mesh, want)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{label(key)} is a {type(x).__name__}; pass tensors (local shards).")
        deg = shard_degrees(want, self.mesh.shape, x.ndim)
        shape = tuple(s * d for s, d in zip(x.shape, deg, strict=True))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(
            x, self.mesh, want, run_check=False, shape=torch.Size(shape), stride=stride
        )

    def step(
        self,
        model: nn.Module,
        params: Sequence[DTensor],
        buffers: Sequence[DTensor],
        inputs: Sequence[DTensor],
    ) -> tuple[LoweredStep, TracedGraph]:
        """The lowered step for these inputs' shapes (and the model's mode: a model may
        compute otherwise in eval mode), traced and lowered at the first call; and the
        traced graph it was lowered from (for the output's structure)."""
        shapes = tuple((tuple(x.shape), x.dtype) for x in inputs)
        key = (*shapes, "train" if model.training else "eval")
        if key not in self.steps:

            def example() -> Any:  # called under trace_joint's fake mode, as input_fn was
                args, kwargs = call_form(
                    self.keys, [torch.empty(shape, dtype=dtype) for shape, dtype in shapes]
                )
                return kwargs if kwargs else args

            with _original_class(model):
                traced = trace_joint(
                    model,
                    example,
                    loss_fn=self.loss_fn,
                    param_dtype=self.param_dtype,
                    stamp_layers=self.stamp_layers,
                )
            traced, _ = rewrite(traced, mm_mode=self.mm_mode)
            check_fits(traced, self.plan, training=model.training)
            traced = with_recompute(traced, self.plan.recompute)  # as the plan chose
            graph = PlannedGraph(traced, self.plan, self.mesh, reduce_dtype=self.reduce_dtype)
            self.steps[key] = lower(
                graph,
                params,
                buffers,
                inputs,
                param_dtype=self.param_dtype,
                bucket_bytes=self.bucket_bytes,
                compile=self.compile,
            )
            self._traced[key] = traced
        return self.steps[key], self._traced[key]


def check_fits(traced: TracedGraph, plan: Plan, *, training: bool = True) -> None:
    """Refuse to run ``plan`` on a graph other than the one it was made for.

    Raises ``ValueError`` naming the loss when it differs, else the first node whose op
    differs; plans saved without a fingerprint are checked node by node in
    :class:`PlannedGraph` only. ``training`` is the model's mode, named when the
    graph differs in eval mode (dropout, batch norm).
    """
    if not plan.graph_fingerprint or fingerprint(traced.gm) == plan.graph_fingerprint:
        return
    if traced.loss_name != plan.loss_fn:
        raise PlanError(
            f"the plan was made with loss_fn={plan.loss_fn} but the model is being run with "
            f"loss_fn={traced.loss_name}: its graph differs from the planned one. Pass the "
            "plan's loss to parallelize(..., loss_fn=...) (none: the output is returned), or "
            "plan again with this loss."
        )
    mode = (
        ""
        if training
        else " The model is in eval mode and computes otherwise than in training mode, "
        "in which it was planned: evaluate it in training mode under torch.no_grad()."
    )
    raise PlanError(
        f"the plan does not fit this model's graph: {_first_difference(traced, plan)}. Plan "
        "this exact model (same loss_fn, mm_mode, param_dtype and input shapes and dtypes) "
        f"and apply that plan.{mode}"
    )


def _first_difference(traced: TracedGraph, plan: Plan) -> str:
    """Where the traced graph first departs from the plan's nodes, in words."""
    seen = set()
    for node in traced.gm.graph.nodes:
        if node.op == "output":
            continue
        seen.add(node.name)
        entry = plan.node_placements.get(node.name)
        op = op_name(node)
        if entry is None:
            return f"node {node.name} ({op}) is not in the plan"
        if entry.op != op:
            return f"node {node.name} is {op} here but {entry.op} in the plan"
    extra = [n for n in plan.node_placements if n not in seen]
    if extra:
        return f"the plan has nodes this graph lacks (first: {extra[0]})"
    return "every node has the planned op, but a shape, dtype or argument differs"


class _PlannedCall(torch.autograd.Function):
    """The forward program in forward, the backward program in backward."""

    @staticmethod
    def forward(
        ctx: Any, step: LoweredStep, mesh: DeviceMesh, n_params: int, *tensors: DTensor
    ) -> tuple[DTensor, ...]:
        outs, saved = step.run_forward([x.to_local() for x in tensors])
        ctx.step, ctx.mesh, ctx.saved = step, mesh, saved
        ctx.params, ctx.n_rest = tensors[:n_params], len(tensors) - n_params
        results = _place_outputs(step, mesh, outs)
        ctx.mark_non_differentiable(
            *(r for r, o in zip(results, step.outputs, strict=True) if not o.differentiable)
        )
        return results

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grad_outs: Any) -> tuple[Any, ...]:
        step: LoweredStep = ctx.step
        tangents = [
            _cotangent(g, o, ctx.mesh)
            for g, o in zip(grad_outs, step.outputs, strict=True)
            if o.differentiable
        ]
        grads = step.run_backward(ctx.saved, tangents)
        ctx.saved = None  # the activations go as soon as the backward is done with them
        params = [_like(grads.get(f), p) for f, p in zip(step.param_fqns, ctx.params, strict=True)]
        return (None, None, None, *params, *([None] * ctx.n_rest))


def _place_outputs(
    step: LoweredStep, mesh: DeviceMesh, outs: Sequence[torch.Tensor]
) -> tuple[DTensor, ...]:
    return tuple(
        DTensor.from_local(
            x, mesh, o.placements, run_check=False, shape=torch.Size(o.shape), stride=o.stride
        )
        for x, o in zip(outs, step.outputs, strict=True)
    )


def _cotangent(grad: Any, out: OutputSpec, mesh: DeviceMesh) -> torch.Tensor:
    """An output's gradient as the backward program's cotangent shard.

    It is expected where the plan priced its arrival (the output's placement, a partial
    sum's as replicated); one computed elsewhere is moved there (outside the plan), one
    that never came (the output did not reach the loss) is zero.
    """
    where = cotangent_placements(out.placements)
    if grad is None:
        return torch.zeros(rank_local_shape(out.shape, mesh, where), dtype=out.dtype)
    if not isinstance(grad, DTensor):  # a full gradient: every rank holds all of it
        grad = DTensor.from_local(grad, mesh, [Replicate()] * mesh.ndim, run_check=False)
    if tuple(grad.placements) != where:
        grad = grad.redistribute(mesh, where)
    return grad.to_local().contiguous()


def _like(local: torch.Tensor | None, param: DTensor) -> DTensor | None:
    """A gradient shard as a DTensor placed like its parameter (no communication)."""
    if local is None:
        return None
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
        stride=param.stride(),
    )  # fmt: skip


def _planned_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    state = _state(self)
    inputs = state.inputs(args, kwargs)
    # the trace's order: every parameter (frozen ones too), then every buffer (trace_joint);
    # the checker cannot know that parallelize made each of them a DTensor
    ps = cast(list[DTensor], list(self.parameters()))
    bs = cast(list[DTensor], list(self.buffers()))
    step, traced = state.step(self, ps, bs, inputs)
    if torch.is_grad_enabled() and self.training:
        outs = _PlannedCall.apply(step, state.mesh, len(ps), *ps, *bs, *inputs)
    else:  # forward only: nothing saved, no backward
        local = [x.to_local() for x in (*ps, *bs, *inputs)]
        outs = _place_outputs(step, state.mesh, step.run_inference(local))
    if state.loss_fn is not None:
        return outs[0].full_tensor()  # the loss as a plain tensor (replicated: no collective)
    return traced.unflatten(outs)


def _autoplan_graphs(self: nn.Module) -> dict[tuple[Any, ...], LoweredStep]:
    """The lowered step of each input shape (and mode) run so far, keyed by the inputs'
    shapes and dtypes and ``"train"`` or ``"eval"``; ``print`` one to read its programs."""
    return dict(_state(self).steps)


def _state(model: nn.Module) -> PlannedState:
    state = model._autoplan_state
    assert isinstance(state, PlannedState), "install() gave the planned model its state"
    return state


def install(model: nn.Module, state: PlannedState) -> None:
    """Swap ``model``'s class for a subclass whose forward runs the plan (FSDP2's idiom)."""
    cls = type(model)
    if getattr(cls, "_autoplan_base", None) is None:
        model.__class__ = type(
            f"Planned{cls.__name__}",
            (cls,),
            {
                "forward": _planned_forward,
                "autoplan_graphs": _autoplan_graphs,
                "_autoplan_base": cls,
            },
        )
    # nn.Module.__setattr__ stores any value; torch annotates it Tensor | Module
    model._autoplan_state = state  # type: ignore[assignment]


_OWN_HOOKS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


@contextlib.contextmanager
def _original_class(model: nn.Module) -> Iterator[None]:
    """The model as the planner traced it: its own class, without the planned call's hooks.

    Hooks on the top module belong to the planned forward that is running the trace
    (a debug tool's module tracker registers them there); firing them again inside the
    trace would unbalance that tool's bookkeeping.
    """
    planned = type(model)
    saved = {name: dict(getattr(model, name)) for name in _OWN_HOOKS}
    base = getattr(planned, "_autoplan_base", None)
    assert isinstance(base, type), f"{planned.__name__} is a class install() made"
    model.__class__ = base
    try:
        for name in _OWN_HOOKS:
            getattr(model, name).clear()
        yield
    finally:
        model.__class__ = planned
        for name, hooks in saved.items():
            getattr(model, name).update(hooks)
