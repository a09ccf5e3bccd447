"""Stage 7, apply: turn a :class:`~autoplan.plan.Plan` into a model that trains on a real mesh.

Input: an ``nn.Module`` (real CPU weights or on the meta device), the ``Plan`` made for
it, and a real ``DeviceMesh`` (gloo on CPU, NCCL on GPUs, under ``torchrun``). Output:
the same module, with every parameter replaced by an ``nn.Parameter`` holding a
``DTensor`` placed as the plan says, every buffer replicated, and a forward that runs
the planned training step.

Why: a plan is only worth something if it runs, gives the single-device loss and
gradients, and communicates what the cost model priced. So the parallelized module does
not leave activations to DTensor's own choices: calling it traces the joint
forward+backward graph again (on fake tensors, once per input shape, exactly as the
planner did) and runs it node by node with :class:`~autoplan.execute.PlannedGraph`,
every input of every op redistributed to the placement the plan chose. The call returns
the plan's loss (the ``loss_fn`` given to ``autoplan.plan``, by default the mean of the
output); its ``backward()`` hands each parameter the gradient the graph computed, in the
parameter's own placement, so any ``torch.optim`` optimizer steps on the DTensors.

Parameters placed ``Partial`` or ``_StridedShard`` are not supported yet and raise
``NotImplementedError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from autoplan.config import DTYPES
from autoplan.execute import PlannedGraph, flatten_mesh_groups
from autoplan.placements import Placements, fmt, parse, shard_degrees
from autoplan.plan import Plan
from autoplan.rewrite import rewrite
from autoplan.trace import trace_joint

__all__ = ["full_gradients", "input_placements", "parallelize", "shard_inputs"]

INPUT_PREFIX = "xs_"  # trace_joint's step(ps, bs, xs): make_fx names inputs xs_1, xs_2, ...


def parallelize(
    model: nn.Module,
    plan: Plan,
    mesh: DeviceMesh,
    *,
    init_fn: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Place ``model``'s parameters on ``mesh`` as ``plan`` says; return ``model``.

    Each parameter becomes ``nn.Parameter(distribute_tensor(p, mesh, placements))``:

    - a model holding real CPU weights keeps its values: rank 0's weights are the
      source (``distribute_tensor``'s default), so every rank holds its shard of the
      same global tensor;
    - a model on the meta device is materialized shard by shard: its meta parameters
      are distributed (no memory, no communication), then ``model.to_empty(device="cpu")``
      allocates only each rank's local shards, then ``init_fn(model)`` fills them (without
      ``init_fn`` the values are uninitialized memory). ``init_fn`` runs while buffers are
      still plain tensors, so it may fill them with ordinary tensor ops; parameters are
      DTensors by then, so it must use ops DTensor supports (``nn.init.*`` does).

    Buffers are replicated on every mesh axis. A frozen parameter (``requires_grad=False``)
    the plan does not list (planning traces only trainable ones) is replicated.

    Raises ``ValueError`` when ``mesh`` does not have the plan's shape or a parameter is
    missing from the plan or has another shape, and ``NotImplementedError`` when a
    parameter is placed ``Partial`` or ``_StridedShard``.
    """
    if tuple(mesh.shape) != tuple(plan.mesh_shape):
        raise ValueError(
            f"mesh shape {tuple(mesh.shape)} does not match the plan's mesh_shape "
            f"{tuple(plan.mesh_shape)} (axes {plan.axis_names}); build the mesh with "
            f"init_device_mesh(device, {tuple(plan.mesh_shape)}, mesh_dim_names={plan.axis_names}) "
            "or plan again for this mesh."
        )
    targets = _param_placements(model, plan, mesh.ndim)
    is_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])

    done: dict[int, nn.Parameter] = {}  # tied parameters stay tied
    for mod_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param is None:
                continue
            if id(param) not in done:
                fqn = f"{mod_name}.{name}" if mod_name else name
                local = distribute_tensor(param.detach(), mesh, targets[fqn])
                done[id(param)] = nn.Parameter(local, requires_grad=param.requires_grad)
            setattr(module, name, done[id(param)])

    if is_meta:
        model.to_empty(device="cpu")
        if init_fn is not None:
            init_fn(model)
    _replicate_buffers(model, mesh)
    flatten_mesh_groups(mesh)
    _install_planned_forward(model, _PlannedState(plan, mesh))
    return model


def _param_placements(model: nn.Module, plan: Plan, num_axes: int) -> dict[str, Placements]:
    """The plan's placements for every parameter FQN of ``model``, checked."""
    out: dict[str, Placements] = {}
    for fqn, param in model.named_parameters():
        if fqn not in plan.param_placements:
            if not param.requires_grad:
                out[fqn] = (Replicate(),) * num_axes
                continue
            raise ValueError(
                f"parameter {fqn!r} (shape {tuple(param.shape)}) is not in the plan; the plan has "
                f"{len(plan.param_placements)} parameters. Plan this exact model "
                "(same module structure and parameter names) and apply that plan."
            )
        want = plan.param_shapes.get(fqn)
        if want is not None and tuple(want) != tuple(param.shape):
            raise ValueError(
                f"parameter {fqn!r} has shape {tuple(param.shape)} but the plan was made for "
                f"shape {tuple(want)}; plan the model with the same dimensions."
            )
        placements = tuple(plan.param_placements[fqn])
        for p in placements:
            if type(p) not in (Shard, Replicate):
                raise NotImplementedError(
                    f"parameter {fqn!r} is placed {fmt(placements)}: Partial and _StridedShard "
                    "parameter placements are not yet supported by parallelize (only S(d) and R)."
                )
        out[fqn] = placements
    return out


def _replicate_buffers(model: nn.Module, mesh: DeviceMesh) -> None:
    replicate = [Replicate()] * mesh.ndim
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf is None or isinstance(buf, DTensor):
                continue
            persistent = name not in module._non_persistent_buffers_set
            module.register_buffer(
                name, distribute_tensor(buf, mesh, replicate), persistent=persistent
            )


def shard_inputs(
    inputs: torch.Tensor | tuple[torch.Tensor, ...],
    placements: Plan | Sequence[Sequence[Placement] | str],
    mesh: DeviceMesh,
) -> tuple[DTensor, ...]:
    """Turn a GLOBAL batch (the same tensors on every rank) into DTensors to feed the model.

    ``placements`` is the plan itself (its input placements are used) or one entry per
    input, the same ones passed to ``autoplan.plan`` as ``input_placements``: a tuple of
    DTensor placements or a short string such as ``"S(0)R"``. Rank 0's values are the
    source, so ranks need not hold bitwise-equal batches; each keeps only its shard. A
    parallelized model takes these DTensors, or their ``to_local()`` shards.
    """
    if isinstance(placements, Plan):
        placements = input_placements(placements)
    tensors = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if len(tensors) != len(placements):
        raise ValueError(
            f"shard_inputs got {len(tensors)} inputs but {len(placements)} placements; "
            "give one placement per input, as in plan(..., input_placements=...)."
        )
    out = []
    for i, (t, spec) in enumerate(zip(tensors, placements, strict=True)):
        where = parse(spec, mesh.ndim) if isinstance(spec, str) else tuple(spec)
        if len(where) != mesh.ndim:
            raise ValueError(
                f"placements[{i}] = {fmt(where)} has {len(where)} entries; the mesh has "
                f"{mesh.ndim} axes. Give one placement per mesh axis."
            )
        out.append(distribute_tensor(t, mesh, list(where)))
    return tuple(out)


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as a full (global) tensor, keyed by FQN; for checks.

    A collective on DTensor gradients: call it on every rank. Parameters without a
    gradient are left out.
    """
    grads = {}
    for fqn, param in model.named_parameters():
        if param.grad is None:
            continue
        g = param.grad
        grads[fqn] = g.full_tensor() if isinstance(g, DTensor) else g
    return grads


def input_placements(plan: Plan) -> list[Placements]:
    """The placements the plan gives the model's inputs, in argument order."""
    names = sorted(
        (n for n, e in plan.node_placements.items() if n.startswith(INPUT_PREFIX)),
        key=lambda n: int(n.removeprefix(INPUT_PREFIX)),
    )
    return [parse(plan.node_placements[n]["out"][0], len(plan.mesh_shape)) for n in names]


class _PlannedState:
    """What a parallelized module keeps: the plan, the mesh, a planned graph per input shape."""

    def __init__(self, plan: Plan, mesh: DeviceMesh) -> None:
        self.plan, self.mesh = plan, mesh
        self.placements = input_placements(plan)
        cfg = plan.config
        self.mm_mode = cfg.get("mm_mode", "einsum")
        self.param_dtype = DTYPES[cfg["param_dtype"]] if cfg.get("param_dtype") else None
        self.reduce_dtype = DTYPES[cfg["reduce_dtype"]] if cfg.get("reduce_dtype") else None
        self.graphs: dict[tuple[Any, ...], PlannedGraph] = {}

    def inputs(self, args: Sequence[Any]) -> tuple[DTensor, ...]:
        if len(args) != len(self.placements):
            raise TypeError(
                f"the parallelized model takes {len(self.placements)} inputs (as planned), got "
                f"{len(args)}."
            )
        out = []
        planned = self.plan.input_shapes or (None,) * len(args)
        for i, (x, want) in enumerate(zip(args, self.placements, strict=True)):
            if isinstance(x, DTensor):
                if tuple(x.placements) != want:
                    x = x.redistribute(self.mesh, want)
                out.append(x)
            elif isinstance(x, torch.Tensor):
                deg = shard_degrees(want, self.mesh.shape, x.ndim)
                shape = tuple(s * d for s, d in zip(x.shape, deg, strict=True))
                stride = torch.empty(shape, device="meta").stride()
                out.append(
                    DTensor.from_local(
                        x, self.mesh, want, run_check=False, shape=shape, stride=stride
                    )
                )
            else:
                raise TypeError(f"input {i} is a {type(x).__name__}; pass tensors (local shards).")
            if planned[i] is not None and tuple(out[-1].shape) != tuple(planned[i]):
                raise ValueError(
                    f"input {i} has global shape {tuple(out[-1].shape)} (placed {fmt(want)} on "
                    f"mesh {tuple(self.mesh.shape)}) but the plan was made for {tuple(planned[i])}; "
                    "pass each rank's shard of a batch of the planned shape, or plan again."
                )
        return tuple(out)

    def graph(self, model: nn.Module, inputs: Sequence[DTensor]) -> PlannedGraph:
        key = tuple((tuple(x.shape), x.dtype) for x in inputs)
        if key not in self.graphs:

            def example() -> tuple[torch.Tensor, ...]:  # called under trace_joint's fake mode
                return tuple(torch.empty(shape, dtype=dtype) for shape, dtype in key)

            with _original_class(model):
                traced = trace_joint(model, example, param_dtype=self.param_dtype)
            traced, _ = rewrite(traced, mm_mode=self.mm_mode)
            self.graphs[key] = PlannedGraph(
                traced, self.plan, self.mesh, reduce_dtype=self.reduce_dtype
            )
        return self.graphs[key]


class _JointStep(torch.autograd.Function):
    """Runs the whole planned step in forward; backward hands out the computed gradients."""

    @staticmethod
    def forward(
        ctx: Any, graph: PlannedGraph, param_dtype: torch.dtype | None, n_params: int, *tensors: Any
    ) -> torch.Tensor:
        t = graph.traced
        params = list(tensors[:n_params])
        if param_dtype is not None:  # FSDP2-style: compute in param_dtype, keep fp32 masters
            params = [p.to(param_dtype) for p in params]
        buffers = tensors[n_params : n_params + len(t.buffers)]
        inputs = tensors[n_params + len(t.buffers) :]
        loss, grads = graph.run(params, buffers, inputs)
        ctx.grads = [
            None if grads.get(fqn) is None else grads[fqn].to(p.dtype)
            for fqn, p in zip(t.param_fqns, tensors[:n_params], strict=True)
        ]
        ctx.n_rest = len(tensors) - n_params
        if all(isinstance(p, Replicate) for p in loss.placements):
            return loss.to_local()
        return loss.full_tensor()  # not priced: plan with output_placements=["R..."] to avoid it

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        scale = float(grad_loss)
        grads = [g if g is None or scale == 1.0 else g * scale for g in ctx.grads]
        return (None, None, None, *grads, *([None] * ctx.n_rest))


def _planned_forward(self: nn.Module, *args: Any) -> torch.Tensor:
    state: _PlannedState = self._autoplan_state
    inputs = state.inputs(args)
    graph = state.graph(self, inputs)
    params = dict(self.named_parameters())
    buffers = dict(self.named_buffers())
    t = graph.traced
    tensors = [params[f] for f in t.param_fqns] + [buffers[f] for f in t.buffer_fqns]
    return _JointStep.apply(graph, state.param_dtype, len(t.param_fqns), *tensors, *inputs)


def _install_planned_forward(model: nn.Module, state: _PlannedState) -> None:
    """Swap ``model``'s class for a subclass whose forward runs the plan (FSDP2's idiom)."""
    cls = type(model)
    if getattr(cls, "_autoplan_base", None) is None:
        model.__class__ = type(
            f"Planned{cls.__name__}",
            (cls,),
            {"forward": _planned_forward, "_autoplan_base": cls},
        )
    model._autoplan_state = state


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
    model.__class__ = planned._autoplan_base
    try:
        for name in _OWN_HOOKS:
            getattr(model, name).clear()
        yield
    finally:
        model.__class__ = planned
        for name, hooks in saved.items():
            getattr(model, name).update(hooks)
