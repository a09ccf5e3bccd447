"""The adapter: the one module that imports torch's private APIs.

Input: aten ops with tensor metadata. Output: DTensor's own sharding rules for
them, in two forms: *single-dim rules* (per mesh axis, placements of
``[outputs..., tensor inputs...]`` with ``_ShardingPlaceholder`` for "any
sharding of dim d") and *op strategies* (DTensor's full-mesh ``OpStrategy``
functions, used for view-like and reduction ops that only have those).

Why one module: DTensor's strategy registry, ``OpSchema``, ``_StridedShard``,
fake tensors and the fake process group are private and change between torch
releases. Everything else in autoplan imports them from here, so a torch
upgrade touches this file alone.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops  # noqa: F401  (registers DTensor's rules)
import torch.distributed.tensor._ops.utils as _dtensor_op_utils
from torch._functorch.partitioners import default_partition
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops._matrix_ops import gen_single_dim_einsum_strategies
from torch.distributed.tensor._ops.single_dim_strategy import (
    _fill_single_dim_strategy_placeholders,
    _ShardingPlaceholder,
)
from torch.distributed.tensor._redistribute import Redistribute
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
    _MaskPartial,
    _StridedShard,
)
from torch.fx._lazy_graph_module import (
    _force_skip_lazy_graph_module,
    _make_graph_module,
    _use_lazy_graph_module,
)
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, track_tensor_tree
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.nn.modules import module as _module
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from autoplan.core.errors import PlanError

OpOverload = torch._ops.OpOverload  # an aten op with its overload, as graph nodes target

__all__ = [
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "UnsupportedOperatorException",
    "MemTracker",
    "mutates",
    "DTensorSpec",
    "DeviceMesh",
    "FakeTensor",
    "FakeTensorMode",
    "LocalTensorMode",
    "OpOverload",
    "OpSchema",
    "OpSpec",
    "OpStrategy",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "ShardingPlaceholder",
    "TensorMeta",
    "TupleStrategy",
    "_StridedShard",
    "einsum_rules",
    "flatten_axes",
    "redistribute",
    "extract_tensor_metadata",
    "fill_placeholders",
    "force_eager_graph_module",
    "global_module_hooks",
    "has_op_strategy",
    "init_fake_process_group",
    "isolated_trace",
    "late_input",
    "is_masked_partial",
    "rank_local_shape",
    "masked_partial",
    "masked_partial_key",
    "op_strategy",
    "partition_joint",
    "pytree",
    "single_dim_rules",
    "tensor_meta",
    "use_lazy_graph_module",
    "make_graph_module",
]

ShardingPlaceholder = _ShardingPlaceholder
extract_tensor_metadata = _extract_tensor_metadata
# GraphModules that generate their Python code on first use (see autoplan/trace/capture.py).
use_lazy_graph_module = _use_lazy_graph_module
make_graph_module = _make_graph_module  # lazy under use_lazy_graph_module(True)
force_eager_graph_module = _force_skip_lazy_graph_module
aten = torch.ops.aten


def rank_local_shape(
    shape: tuple[int, ...], mesh: DeviceMesh, placements: Sequence[Placement]
) -> tuple[int, ...]:
    """This rank's shard shape of a tensor of global ``shape`` placed ``placements`` on
    ``mesh``, uneven shards included (the planner's even-shard shape over a mesh shape is
    :func:`autoplan.core.placements.local_shape`)."""
    return tuple(
        compute_local_shape_and_global_offset(shape, mesh, placements, skip_offset=True)[0]
    )


def mutates(node: torch.fx.Node) -> bool:
    """Whether ``node`` writes to a tensor or has another side effect than its result.

    Unlike ``Node.is_impure``, an op is not impure for drawing random numbers: a copy
    of a forward op whose result nothing reads (as the partitioner leaves in a
    backward) is dead even when it is attention or dropout.
    """
    target = node.target
    if isinstance(target, OpOverload):
        return target._schema.is_mutable
    return node.is_impure()


def partition_joint(joint: torch.fx.GraphModule, num_fwd_outputs: int) -> Any:
    """Torch's default partitioner: split a joint graph (placeholders ``primals_*`` and
    ``tangents_*``, nodes of the forward tagged) into forward and backward modules."""
    return default_partition(joint, None, num_fwd_outputs=num_fwd_outputs)


# Attention ops a CPU trace produces. DTensor has rules only for the GPU
# kernels; the plan is for GPUs, so autoplan gives the CPU kernels the same
# batch- and head-sharded rules (dims: [batch, heads, seq, head_dim]).
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _propagator() -> Any:
    return DTensor._op_dispatcher.sharding_propagator


def _attention_rules(op: OpOverload) -> list[list[Placement | _ShardingPlaceholder]]:
    # forward: [out, logsumexp, q, k, v]; backward: [dq, dk, dv, grad_out, q, k, v, out, lse]
    width = 5 if op is _CPU_FLASH else 9
    return [[_ShardingPlaceholder(d)] * width for d in (0, 1)]


def single_dim_rules(
    op: OpOverload, args_meta: Sequence[Any], kwargs_meta: dict[str, Any]
) -> list[list[Placement | _ShardingPlaceholder | None]] | None:
    """DTensor's single-dim rules for ``op``, or None when it has none.

    ``args_meta`` mirrors the op's arguments with ``TensorMeta`` in place of
    tensors. Each rule lists placements for ``[outputs..., tensor inputs...]``
    on one mesh axis; the all-replicate rule is always included.
    """
    if op in (_CPU_FLASH, _CPU_FLASH_BWD):
        rules: list[list[Any]] = list(_attention_rules(op))
    else:
        info = _propagator().op_single_dim_strategy_funcs.get(op)
        if info is None:
            return None
        rules = [list(r) for r in info.func(op, tuple(args_meta), dict(kwargs_meta))]
    width = len(rules[0]) if rules else None
    if width is not None and not any(all(isinstance(p, Replicate) for p in r) for r in rules):
        rules.insert(0, [Replicate()] * width)
    return rules


def einsum_rules(equation: str) -> list[list[Placement | _ShardingPlaceholder]]:
    """Single-dim rules of an einsum ``[out, lhs, rhs]``, from DTensor's einsum generator.

    The generator lists only sharded and partial rules; DTensor's expansion to the mesh
    adds full replication itself, so it is added here as for every other op.
    """
    rules = [list(r) for r in gen_single_dim_einsum_strategies(equation)]
    width = len(rules[0]) if rules else 3
    if not any(all(isinstance(p, Replicate) for p in r) for r in rules):
        rules.insert(0, [Replicate()] * width)
    return rules


def fill_placeholders(
    rules: list[list[Placement | _ShardingPlaceholder | None]], seen: set[Placement]
) -> list[list[Placement | None]]:
    """Replace placeholders by ``Shard(d)`` and by ``_StridedShard(d, sf)`` for each split
    factor ``sf`` among the ``seen`` input placements (DTensor's own expansion)."""
    return _fill_single_dim_strategy_placeholders(seen | {Shard(0)}, rules)


def tensor_meta(val: torch.Tensor) -> TensorMeta:
    """DTensor's metadata record of a (fake) tensor."""
    return TensorMeta(val.shape, val.stride(), val.dtype)


def is_masked_partial(p: Placement) -> TypeGuard[_MaskPartial]:
    """The vocab-parallel embedding's partial (a sum with a mask step before it)."""
    # By exact type, remembered per class: isinstance on torch 2.13's placement classes
    # goes through a slow metaclass check (see autoplan.core.placements).
    t = type(p)
    found = _MASKED.get(t)
    if found is None:
        found = _MASKED[t] = issubclass(t, _MaskPartial)
    return found


_MASKED: dict[type, bool] = {}


def masked_partial_key(p: Placement) -> tuple[object, ...]:
    """What identifies a masked partial, without its per-instance mask buffer."""
    assert isinstance(p, _MaskPartial)
    return (p.reduce_op, tuple(p.offset_shape or ()), p.offset_dim)


def masked_partial(
    reduce_op: str, offset_shape: Sequence[int] | None, offset_dim: int
) -> Placement:
    """A masked partial as the vocab-parallel embedding makes it (empty mask buffer)."""
    shape = None if offset_shape is None else torch.Size(offset_shape)
    return _MaskPartial(reduce_op, offset_shape=shape, offset_dim=offset_dim)


def has_op_strategy(op: OpOverload) -> bool:
    return op in _propagator().op_strategy_funcs


def _zero_cost(current_spec: DTensorSpec, target_spec: DTensorSpec) -> float:
    return 0.0


@contextlib.contextmanager
def _without_dtensor_costs() -> Iterator[None]:
    # DTensor's strategy functions price every (input candidate, requirement)
    # pair with its graph-search redistribution planner: ~80% of a planning
    # run's time on LLaMA, and autoplan prices redistributions itself. Swap the
    # pricing function for a zero while a strategy function runs.
    saved = _dtensor_op_utils.redistribute_cost
    _dtensor_op_utils.redistribute_cost = _zero_cost
    try:
        yield
    finally:
        _dtensor_op_utils.redistribute_cost = saved


def op_strategy(op: OpOverload, schema: OpSchema) -> OpStrategy | TupleStrategy:
    """Run DTensor's full-mesh strategy function for ``op`` on ``schema`` (unpriced)."""
    with _without_dtensor_costs():
        return _propagator().op_strategy_funcs[op](schema)


def schema_info(op: OpOverload) -> Any:
    return _propagator().op_to_schema_info.get(op)


# The default groups init_fake_process_group made: the process group is process-wide,
# so is this record; weak, so a group destroyed by anyone leaves it.
_PLANNING_GROUPS: weakref.WeakSet[dist.ProcessGroup] = weakref.WeakSet()


def init_fake_process_group(world_size: int) -> None:
    """Make the default process group a fake one of ``world_size`` ranks on this one CPU.

    The ``"fake"`` backend runs no collective; it only lets ``DeviceMesh`` exist for
    planning. torch registers the backend itself when asked for a fake group without a
    store. An initialized default group is used as it is when it is fake and of this
    size (planning runs no collective on it), destroyed and replaced when this function
    made it, and otherwise left alone with a :class:`PlanError`: a job's group (gloo,
    nccl) or a fake group someone else made is never destroyed.
    """
    if dist.is_initialized():
        backend, size = dist.get_backend(), dist.get_world_size()
        if backend == "fake" and size == world_size:
            return
        if backend != "fake":
            raise PlanError(
                f"a process group is initialized in this process (backend {backend!r}, "
                f"{size} ranks), and a fake one for planning would replace it. Inside a job, "
                "pass the job's mesh to autoplan.plan (e.g. init_device_mesh('cuda', (2, 4), "
                "mesh_dim_names=('dp', 'tp'))): it plans on that mesh's shape and names and "
                "runs no collective."
            )
        if dist.group.WORLD not in _PLANNING_GROUPS:
            raise PlanError(
                f"a fake process group of {size} ranks that autoplan did not create is "
                f"initialized in this process, and a fake mesh of {world_size} ranks would "
                f"replace it. Plan on a mesh of {size} ranks, or destroy that group first "
                "(torch.distributed.destroy_process_group())."
            )
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size)
    world = dist.group.WORLD
    assert world is not None, "init_process_group sets the default group"
    _PLANNING_GROUPS.add(world)


def flatten_axes(mesh: DeviceMesh, names: Sequence[str]) -> DeviceMesh:
    """The flattened mesh of ``mesh``'s axes ``names`` (adjacent), created if missing.

    DTensor's redistribute runs a run of same-kind collectives on these axes as one
    collective over this mesh when it exists.
    """
    return mesh[tuple(names)]._flatten("_".join(names))


def redistribute(value: DTensor, mesh: DeviceMesh, placements: Sequence[Placement]) -> DTensor:
    """``value.redistribute(mesh, placements)``, also to ``Partial`` from another placement.

    The public API refuses ``R -> P`` ("for internal use only"), yet a planned strategy
    may need it (e.g. ``add(P, R)`` as ``add(P, P)``: DTensor's internal step keeps the
    value on one rank and zeros elsewhere, no communication). Same autograd behaviour.
    """
    placements = tuple(placements)
    if not any(
        isinstance(p, Partial) and p != q for p, q in zip(placements, value.placements, strict=True)
    ):
        return value.redistribute(mesh, placements)
    dtype = value.to_local().dtype
    options = {"op_dtype": dtype, "out_dtype": dtype}
    return Redistribute.apply(
        value, mesh, placements, False, options | {"backward_options": dict(options)}
    )


_GLOBAL_MODULE_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


@contextlib.contextmanager
def isolated_trace() -> Iterator[None]:
    """Trace as if no profiler or debug mode were active, then restore them.

    Tools such as ``CommDebugMode`` push a dispatch mode and install global module
    hooks (its module tracker); traced under them, ``make_fx`` records the hooks'
    extra ``detach`` and backward-hook nodes, and the graph no longer matches the
    one a plan was made from.
    """
    saved = {name: dict(getattr(_module, name)) for name in _GLOBAL_MODULE_HOOKS}
    full_backward = _module._global_is_full_backward_hook
    try:
        for name in _GLOBAL_MODULE_HOOKS:
            getattr(_module, name).clear()
        _module._global_is_full_backward_hook = None
        with _disable_current_modes():
            yield
    finally:
        for name, hooks in saved.items():
            getattr(_module, name).update(hooks)
        _module._global_is_full_backward_hook = full_backward


def late_input(like: torch.Tensor, name: str) -> torch.Tensor:
    """Inside ``make_fx``: a new input of the graph being traced, a placeholder named
    ``name`` holding an empty tensor like ``like``, for an input only known once the
    traced function has run part of its body (the cotangents of a forward's outputs).
    The placeholder sits where it was made; the caller moves it among the others."""
    with disable_proxy_modes_tracing() as mode:
        if mode is None:
            raise RuntimeError("late_input makes a graph input while make_fx traces only")
        value = torch.empty_like(like)
        proxy = mode.tracer.create_proxy("placeholder", name, (), {}, name=name)
        track_tensor_tree(value, proxy, constant=None, tracer=mode.tracer)
    return value


def global_module_hooks() -> bool:
    """Whether a hook registered for every module (``register_module_forward_hook``...) is set."""
    kinds = ("forward", "forward_pre", "backward", "backward_pre")
    return any(getattr(torch.nn.modules.module, f"_global_{k}_hooks", None) for k in kinds)
