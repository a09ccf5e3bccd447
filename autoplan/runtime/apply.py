"""Stage 7, apply: turn a :class:`~autoplan.result.plan.Plan` into a model that trains on a real mesh.

Input: an ``nn.Module`` (real CPU weights or on the meta device), the ``Plan`` made for
it, and a real ``DeviceMesh`` (gloo on CPU, NCCL on GPUs, under ``torchrun``). Output:
the same module, with every parameter replaced by an ``nn.Parameter`` holding a
``DTensor`` placed as the plan says, every buffer replicated, and a forward that runs
the planned training step.

Why: a plan is only worth something if it runs, gives the single-device loss and
gradients, and communicates what the cost model priced. So the parallelized module does
not leave activations to DTensor's own choices: its call
(:mod:`autoplan.runtime.planned_module`) runs the planned joint graph lowered to this rank's
local ops and the collectives of every planned move (:mod:`autoplan.runtime.lower`), split into a
forward and a backward program. The call returns the model's own output (its pytree, as
DTensors in the planned output placements; the loss, for a plan made with a ``loss_fn``);
a ``backward()`` through it runs the backward program and hands each parameter the
gradient one device computes, in the parameter's own placement, so any ``torch.optim``
optimizer steps on the DTensors.

Parameters placed ``Partial`` or ``_StridedShard`` are not supported yet and raise
``NotImplementedError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from autoplan.core.errors import PlanError
from autoplan.core.inputs import InputKey, call_form, flatten_inputs, label
from autoplan.core.placements import Placements, fmt, parse, sharded_dim
from autoplan.result.plan import Plan
from autoplan.runtime.execute import flatten_mesh_groups
from autoplan.runtime.planned_module import PlannedState, install
from autoplan.runtime.release import full_tensors
from autoplan.trace.capture import LossFn

__all__ = ["check_mesh", "full_gradients", "input_placements", "parallelize", "shard_inputs"]

INPUT_PREFIX = "xs_"  # trace_joint's step(ps, bs, xs): make_fx names inputs xs_1, xs_2, ...


def parallelize(
    model: nn.Module,
    plan: Plan,
    mesh: DeviceMesh,
    *,
    init_fn: Callable[[nn.Module], None] | None = None,
    loss_fn: LossFn | None = None,
    bucket_mib: float | None = None,
    compile: bool = False,
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
      A meta model with non-persistent buffers (in no state dict) needs ``init_fn``:
      without it ``parallelize`` raises. Weights may also come from a full state dict
      afterwards: ``set_model_state_dict(model, full, options=StateDictOptions(
      full_state_dict=True, broadcast_from_rank0=True))`` (rank 0 holds it).

    ``loss_fn`` is the loss the plan was made with (``autoplan.plan(..., loss_fn=...)``);
    the module's call then returns that loss. Without one (the default) the call returns
    the model's output and any loss is computed on it outside. A plan
    runs only on the graph it was made for: the first call traces the model again and
    refuses a graph whose fingerprint differs from the plan's (another loss, model,
    ``mm_mode``, dtype or input shape), naming the first difference. ``compile=True`` runs
    each lowered step (:mod:`autoplan.runtime.lower`) through ``torch.compile``. ``bucket_mib``
    caps the buckets the parameters' gathers and the gradients' reductions run in
    (:mod:`autoplan.runtime.bucket_program`; None: the plan's ``PlanConfig.bucket_mib``, whose buckets
    ``plan.buckets`` lists and prices; 0: one collective per planned move).

    Buffers are replicated on every mesh axis. A frozen parameter (``requires_grad=False``)
    is placed as planned like any other and stays frozen: it gets no gradient.

    Raises :class:`~autoplan.core.errors.PlanError` (a ``ValueError``) for an infeasible plan,
    when ``mesh`` does not have the plan's shape or names its axes otherwise
    (:func:`check_mesh`), a parameter is missing from the plan,
    has another shape or a placement that does not fit it (another number of mesh axes,
    a dim it lacks), or the plan places a parameter the model lacks (a plan for another
    model), before any tensor is distributed; and ``NotImplementedError`` when a
    parameter is placed ``Partial`` or ``_StridedShard``.
    """
    if plan.status == "infeasible":
        raise PlanError(
            f"the plan is infeasible, it places nothing: {plan.message or 'no plan fits'} "
            "Plan again with what the message suggests, then apply that plan."
        )
    check_mesh(plan, mesh)
    targets = _param_placements(model, plan, mesh.ndim)
    is_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    if is_meta and init_fn is None:
        _refuse_unfilled_buffers(model)

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
    if bucket_mib is None:
        bucket_mib = plan.config.get("bucket_mib", 25.0)
    if isinstance(bucket_mib, bool) or not (
        isinstance(bucket_mib, (int, float)) and 0 <= bucket_mib < float("inf")
    ):
        raise PlanError(
            f"bucket_mib={bucket_mib!r}: give a size in MiB >= 0 (0 turns bucketing off)."
        )
    state = PlannedState(
        plan,
        mesh,
        input_placements(plan),
        loss_fn=loss_fn,
        bucket_bytes=int(bucket_mib * 2**20),
        compile=compile,
    )
    install(model, state)
    return model


def check_mesh(plan: Plan, mesh: DeviceMesh) -> None:
    """A PlanError unless ``mesh`` is the mesh ``plan`` was made for: its shape, and its
    axis names in order when both name them (an unnamed mesh is taken axis by axis).

    The plan's prices assumed which axis is which (the one spanning nodes pays the
    network's bandwidth), so a mesh of the same shape with its axes named or ordered
    otherwise, ``(tp, dp)`` for a plan on ``(dp, tp)``, would run another plan than the
    one priced.
    """
    shape, names = tuple(mesh.shape), mesh.mesh_dim_names
    build = (
        f"build the mesh with init_device_mesh(device, {tuple(plan.mesh_shape)}, "
        f"mesh_dim_names={tuple(plan.axis_names)}), or plan again on this mesh"
    )
    if shape != tuple(plan.mesh_shape):
        raise PlanError(
            f"mesh shape {shape} does not match the plan's mesh_shape "
            f"{tuple(plan.mesh_shape)} (axes {plan.axis_names}); {build}."
        )
    if names is not None and plan.axis_names and tuple(names) != tuple(plan.axis_names):
        raise PlanError(
            f"the mesh's axes are named {tuple(names)} but the plan was made on axes "
            f"{tuple(plan.axis_names)} (mesh_shape {tuple(plan.mesh_shape)}): its prices "
            "assumed which axis is which (the one spanning nodes pays the network), so it "
            f"does not apply to axes named or ordered otherwise; {build}."
        )


def _refuse_unfilled_buffers(model: nn.Module) -> None:
    """A meta model's non-persistent buffers (RoPE tables, masks) are in no state dict, so
    without ``init_fn`` nothing would ever fill them: the model would compute silently
    on uninitialized memory."""
    names = [
        f"{mod_name}.{name}" if mod_name else name
        for mod_name, module in model.named_modules()
        for name, buf in module.named_buffers(recurse=False)
        if buf is not None and buf.is_meta and name in module._non_persistent_buffers_set
    ]
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise PlanError(
            f"{type(model).__name__} is on the meta device and has non-persistent buffers "
            f"({shown}) that no state dict holds: pass init_fn= to parallelize to compute "
            "them (e.g. the model's own buffer or weight initializer), then load the weights."
        )


def _param_placements(model: nn.Module, plan: Plan, num_axes: int) -> dict[str, Placements]:
    """The plan's placements for every parameter FQN of ``model``, checked against the
    model before DTensor sees them: every parameter placed (frozen ones too), no parameter
    the model lacks, the planned shape, one placement per mesh axis, only dims it has."""
    fix = "Plan this exact model (same modules, parameter names and shapes), apply that plan."
    out: dict[str, Placements] = {}
    for fqn, param in model.named_parameters():
        if fqn not in plan.param_placements:
            raise PlanError(
                f"parameter {fqn!r} (shape {tuple(param.shape)}) is not in the plan; the plan has "
                f"{len(plan.param_placements)} parameters. {fix}"
            )
        want = plan.param_shapes.get(fqn)
        if want is not None and tuple(want) != tuple(param.shape):
            raise PlanError(
                f"parameter {fqn!r} has shape {tuple(param.shape)} but the plan was made for "
                f"shape {tuple(want)}; plan the model with the same dimensions."
            )
        placements = tuple(plan.param_placements[fqn])
        dims = [sharded_dim(p) for p in placements]
        if len(placements) != num_axes or any(d is not None and d >= param.ndim for d in dims):
            raise PlanError(
                f"the plan places parameter {fqn!r} (shape {tuple(param.shape)}) "
                f"{fmt(placements)}, which does not fit it on a mesh of {num_axes} axes: give one "
                f"placement per mesh axis, sharding only {_dims(param.ndim)}. {fix}"
            )
        for p in placements:
            if type(p) not in (Shard, Replicate):
                raise NotImplementedError(
                    f"parameter {fqn!r} is placed {fmt(placements)}: Partial and _StridedShard "
                    "parameter placements are not yet supported by parallelize (only S(d) and R)."
                )
        out[fqn] = placements
    extra = [fqn for fqn in plan.param_placements if fqn not in out]
    if extra:
        raise PlanError(
            f"the plan places parameter {extra[0]!r}, which {type(model).__name__} does not have "
            f"({len(extra)} such parameters): the plan was made for another model. {fix}"
        )
    return out


def _dims(ndim: int) -> str:
    return f"dims 0..{ndim - 1}" if ndim else "no dim (a scalar)"


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
    inputs: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    placements: Plan
    | Sequence[Sequence[Placement] | str]
    | Mapping[str, Sequence[Placement] | str],
    mesh: DeviceMesh,
) -> tuple[DTensor, ...] | dict[str, DTensor]:
    """Turn a GLOBAL batch (the same tensors on every rank) into DTensors to feed the model.

    ``inputs`` has the form ``input_fn`` returned when planning: a tensor, a tuple, or a
    dict of keyword tensors (then a dict comes back, for ``model(**batch)``).
    ``placements`` is the plan itself (its input placements are used) or one entry per
    input, the same ones passed to ``autoplan.plan`` as ``input_placements``: a tuple of
    DTensor placements or a short string such as ``"S(0)R"`` (a dict keyed like the
    batch for a dict); given the plan, ``mesh`` must be the plan's (:func:`check_mesh`).
    Rank 0's values are the source, so ranks need not hold
    bitwise-equal batches; each keeps only its shard. A parallelized model takes these
    DTensors, or their ``to_local()`` shards.
    """
    keys, tensors = flatten_inputs(inputs, "shard_inputs' batch")
    if isinstance(placements, Plan):
        check_mesh(placements, mesh)
        placements = _keyed_placements(placements, keys)
    elif isinstance(placements, Mapping):
        by_key: dict[InputKey, Sequence[Placement] | str] = dict(placements.items())
        absent = [k for k in keys if k not in by_key]
        if absent:
            raise PlanError(
                f"shard_inputs: placements has no entry for input {absent[0]!r}; give one "
                "per key of the batch."
            )
        placements = [by_key[k] for k in keys]
    if len(tensors) != len(placements):
        raise PlanError(
            f"shard_inputs got {len(tensors)} inputs but {len(placements)} placements; "
            "give one placement per input, as in plan(..., input_placements=...)."
        )
    out = []
    for key, t, spec in zip(keys, tensors, placements, strict=True):
        where = parse(spec, mesh.ndim) if isinstance(spec, str) else tuple(spec)
        if len(where) != mesh.ndim:
            raise PlanError(
                f"the placement of {label(key)}, {fmt(where)}, has {len(where)} entries; the "
                f"mesh has {mesh.ndim} axes. Give one placement per mesh axis."
            )
        out.append(distribute_tensor(t, mesh, list(where)))
    args, kwargs = call_form(keys, out)
    return kwargs if isinstance(inputs, Mapping) else args


def _keyed_placements(plan: Plan, keys: Sequence[InputKey]) -> list[Placements]:
    """The plan's input placements in the order of a batch's ``keys``."""
    planned = plan.input_keys or tuple(range(len(input_placements(plan))))
    by_key = dict(zip(planned, input_placements(plan), strict=True))
    if set(keys) != set(planned):
        raise PlanError(
            f"shard_inputs: the batch has inputs {_keys(keys)} but the plan was made for "
            f"{_keys(planned)}; pass a batch of the form input_fn returned when planning."
        )
    return [by_key[k] for k in keys]


def _keys(keys: Sequence[InputKey]) -> str:
    return ", ".join(str(k) if isinstance(k, int) else repr(k) for k in keys) or "none"


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as a full (global) tensor, keyed by FQN; for checks.

    A collective on DTensor gradients: call it on every rank. Parameters without a
    gradient are left out.
    """
    named = [(fqn, p.grad) for fqn, p in model.named_parameters() if p.grad is not None]
    full = full_tensors([g for _, g in named])  # no buffer left on a gloo worker thread
    return {fqn: g for (fqn, _), g in zip(named, full, strict=True)}


def input_placements(plan: Plan) -> list[Placements]:
    """The placements the plan gives the model's inputs, in argument order."""
    names = sorted(
        (n for n, e in plan.node_placements.items() if n.startswith(INPUT_PREFIX)),
        key=lambda n: int(n.removeprefix(INPUT_PREFIX)),
    )
    out = []
    for n in names:
        placed = plan.node_placements[n].out[0]
        assert placed is not None, f"the plan places input {n} as a tensor"
        out.append(placed)
    return out
