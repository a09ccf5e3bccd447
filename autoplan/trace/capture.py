"""Stage 1, trace: capture a model's joint forward+backward graph on fake tensors.

Input: an ``nn.Module`` (its parameters may live on the meta device) and a
function returning the global example inputs (a tensor, a tuple, or a dict of keyword
tensors: :mod:`autoplan.core.inputs`). Output: a :class:`TracedGraph`,
an aten-level ``torch.fx.GraphModule`` whose placeholders are the parameters (frozen
ones too), buffers, inputs and one cotangent per differentiable output, and whose
outputs are the model's output tensors and one gradient per trainable parameter, with
``meta["val"]`` (a fake tensor: shape, dtype, stride) on every node. Given a
``loss_fn``, the one output is the loss and its cotangent a scalar. What the forward
is given and returns is checked as it runs (:mod:`autoplan.trace.forward_checks`): a
mistake there is a PlanError.

Why the cotangent is an input rather than a loss inside: the applied module returns
the model's own output and any loss computed outside drives its backward (what
AOTAutograd does); the graph is then split into a forward and a backward program, and
the values the backward reads from the forward are the activations to keep. The
forward runs once: which outputs take a cotangent is known when the traced forward
returns, and their placeholders are made then (``late_input``) rather than from a
first, untraced forward.

Why this way: a plain ``make_fx`` of ``functional_call`` + ``autograd.grad``
traces the model with no real memory and without the dynamo + AOTAutograd path's
bytecode capture and guards, which planning does not need. Fake tensors are put on
the CPU device rather than meta so that attention dispatches to a fused
attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) the way it
dispatches to flash attention on a GPU, instead of the unfused math path.

Tracing time is torch's per-op Python (make_fx's proxy bookkeeping and FakeTensor
dispatch), paid per layer: a deep stack of alike layers is traced as four and stamped
(:mod:`autoplan.trace.stamp`). Two more costs are cut here: the GraphModule's Python
code is generated once, not twice (lazily, see ``trace_joint``), and cyclic GC is
paused while the heap only grows (see ``_paused_gc``).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from autoplan.core.errors import PlanError
from autoplan.core.inputs import InputKey, call_form, flatten_inputs
from autoplan.core.torch_adapter import (
    FakeTensor,
    FakeTensorMode,
    isolated_trace,
    late_input,
    pytree,
    use_lazy_graph_module,
)
from autoplan.trace.forward_checks import (
    call_input_fn,
    call_loss_fn,
    check_forward_accepts,
    forward_failed,
    no_backward,
    quiet_meta_failures,
)
from autoplan.trace.layers import layer_stack, marked_layers, truncated
from autoplan.trace.stamp import stamp

LossFn = Callable[[Any], torch.Tensor]
TANGENT_PREFIX = "ts_"  # step(ps, bs, xs, ts): make_fx names cotangents ts_1, ts_2, ...
# Every SDPA backend enabled, as by default. A caller's ``sdpa_kernel(SDPBackend.MATH)``
# would otherwise make attention trace as its unfused math decomposition (a causal mask
# from ones/tril, scaled matmuls), so apply's re-trace under it would not match the plan.
_DEFAULT_SDPA = [b for name, b in SDPBackend.__members__.items() if name != "ERROR"]


def mean_loss(output: Any) -> torch.Tensor:
    """A loss for checks: the mean of the (first) output, in float32."""
    out = output[0] if isinstance(output, (tuple, list)) else output
    return out.float().mean()


NO_LOSS = "none"  # the name a plan records when the output is returned (no loss inside)
MEAN_LOSS = "mean"  # the name a plan records for mean_loss


def loss_name(loss_fn: LossFn | None) -> str:
    """The name a plan records for the loss it was made with (for messages; the graph's
    fingerprint is what decides whether a plan fits)."""
    if loss_fn is None:
        return NO_LOSS
    if loss_fn is mean_loss:
        return MEAN_LOSS
    name = getattr(loss_fn, "__qualname__", None) or type(loss_fn).__qualname__
    return f"{getattr(loss_fn, '__module__', None) or '?'}.{name}"


@dataclass(frozen=True)
class TracedGraph:
    """The joint forward+backward graph and what its placeholders and outputs mean.

    ``params`` / ``buffers`` / ``inputs`` list placeholder node names in order;
    ``param_fqns`` the parameter names they stand for, trainable and frozen alike;
    ``frozen`` the FQNs of the frozen ones (``requires_grad=False``: read in the
    forward, no gradient, no optimizer state); ``grads`` maps a parameter FQN to the
    output node holding its gradient (absent when the parameter gets no gradient).
    ``outputs`` are the nodes of the model's output tensors in pytree order (the loss
    alone when traced with a ``loss_fn``); ``tangents`` maps the index of each
    differentiable output to its cotangent's placeholder; ``out_spec`` and ``out_leaves`` rebuild the output's structure
    (:meth:`unflatten`); ``loss_name`` names the loss (:func:`loss_name`).
    """

    gm: fx.GraphModule
    param_fqns: tuple[str, ...]
    buffer_fqns: tuple[str, ...]
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    inputs: tuple[str, ...]
    grads: dict[str, str]
    outputs: tuple[str, ...]
    tangents: dict[int, str]
    trace_seconds: float
    loss_name: str = NO_LOSS
    out_spec: pytree.TreeSpec | None = None
    # the output's pytree leaves, ``None`` where an output tensor goes (in order)
    out_leaves: tuple[Any, ...] = ()
    # each input's position or keyword, in the order of ``inputs`` (autoplan.core.inputs)
    input_keys: tuple[InputKey, ...] = ()
    frozen: tuple[str, ...] = ()
    # traced as four layers and stamped to the depth (autoplan.trace.stamp)
    stamped: bool = False

    @property
    def num_nodes(self) -> int:
        return len(self.gm.graph.nodes)

    def unflatten(self, tensors: Sequence[Any]) -> Any:
        """The model's output structure with ``tensors`` (one per output) in it."""
        if self.out_spec is None:
            return tensors[0]
        it = iter(tensors)
        leaves = [next(it) if leaf is None else leaf for leaf in self.out_leaves]
        return pytree.tree_unflatten(leaves, self.out_spec)

    def node(self, name: str) -> fx.Node:
        for n in self.gm.graph.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def _to_fake(
    t: torch.Tensor, mode: FakeTensorMode, requires_grad: bool, dtype: torch.dtype | None = None
) -> torch.Tensor:
    dtype = dtype if dtype is not None and t.is_floating_point() else t.dtype
    with mode:
        out = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="cpu")
    return out.requires_grad_(requires_grad)


def trace_joint(
    model: nn.Module,
    input_fn: Callable[[], Any],
    *,
    loss_fn: LossFn | None = None,
    param_dtype: torch.dtype | None = None,
    stamp_layers: bool = True,
) -> TracedGraph:
    """Trace ``model(*input_fn())`` (``model(**input_fn())`` for a dict) and its backward
    into one aten graph.

    The backward starts from one cotangent input per differentiable output tensor;
    with ``loss_fn`` the graph computes ``loss_fn(model(*inputs))`` and its one output
    is the loss (its cotangent a scalar input). No real memory is used: parameters,
    buffers and inputs become fake tensors of the same shape, dtype and stride.
    ``input_fn`` is called under the fake mode, so ``torch.randint(...)`` in it
    allocates nothing either. ``param_dtype`` traces floating parameters in that
    dtype, as FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` computes with them.
    A deep stack of alike layers is traced as four and stamped to its depth
    (:mod:`autoplan.trace.stamp`) unless ``stamp_layers`` is False.
    """
    start = time.perf_counter()
    full = _names(model)
    stack = layer_stack(model) if stamp_layers else None
    # A lazy GraphModule only generates and compiles its Python code when ``.code`` or
    # ``forward`` is first used; no stage does (they walk ``gm.graph``). make_fx builds
    # the module with ``_lazy_graph_module._make_graph_module`` (which honours this
    # flag), then ``recompile`` after DCE would generate it a second time. The flag is
    # restored on exit.
    with (
        _paused_gc(),
        use_lazy_graph_module(True),
        sdpa_kernel(_DEFAULT_SDPA),
        quiet_meta_failures(),
    ):
        rec = None
        if stack is not None:  # four layers traced, stamped to the full depth
            with truncated(stack):
                rec = _record(model, input_fn, loss_fn, param_dtype)
            if not stamp(rec.gm, stack, rec.names, full):
                rec = None
        stamped = rec is not None
        if rec is None:
            rec = _record(model, input_fn, loss_fn, param_dtype)
        gm = rec.gm
        _inputs_first(gm)
        gm.graph.eliminate_dead_code()
        _refuse_constants(gm, model)
        gm.recompile()
    trace_seconds = time.perf_counter() - start
    leaves, spec, outs, differentiable = (
        rec.seen["leaves"],
        rec.seen["spec"],
        rec.seen["outs"],
        rec.seen["differentiable"],
    )
    param_fqns, buffer_fqns = full
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    num_p, num_b, num_x = len(param_fqns), len(buffer_fqns), rec.num_inputs
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    flat = list(out_node.args[0])  # make_fx flattens (outs, grads) into [*outs, *grads]
    out_nodes, grad_nodes = flat[: len(outs)], flat[len(outs) :]
    grads = {fqn: g.name for fqn, g in zip(param_fqns, grad_nodes, strict=True) if g is not None}
    tangent_names = placeholders[num_p + num_b + num_x :]
    return TracedGraph(
        gm=gm,
        param_fqns=param_fqns,
        buffer_fqns=buffer_fqns,
        params=tuple(placeholders[:num_p]),
        buffers=tuple(placeholders[num_p : num_p + num_b]),
        inputs=tuple(placeholders[num_p + num_b : num_p + num_b + num_x]),
        input_keys=rec.input_keys,
        grads=grads,
        outputs=tuple(n.name for n in out_nodes),
        tangents=dict(zip(differentiable, tangent_names, strict=True)),
        trace_seconds=trace_seconds,
        loss_name=loss_name(loss_fn),
        out_spec=spec,
        out_leaves=tuple(None if isinstance(x, torch.Tensor) else x for x in leaves),
        frozen=tuple(n for n, p in model.named_parameters() if not p.requires_grad),
        stamped=stamped,
    )


@dataclass(frozen=True)
class _Recorded:
    """A raw ``make_fx`` joint graph and what the traced forward returned."""

    gm: fx.GraphModule
    names: tuple[tuple[str, ...], tuple[str, ...]]  # parameter and buffer FQNs, in order
    input_keys: tuple[InputKey, ...]
    num_inputs: int
    seen: dict[str, Any]


def _names(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(n for n, _ in model.named_parameters()), tuple(n for n, _ in model.named_buffers())


def _record(
    model: nn.Module,
    input_fn: Callable[[], Any],
    loss_fn: LossFn | None,
    param_dtype: torch.dtype | None,
) -> _Recorded:
    """``make_fx`` of the model's forward and backward, before any clean-up."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    named_params = list(model.named_parameters())
    named_buffers = list(model.named_buffers())
    param_fqns = tuple(n for n, _ in named_params)
    buffer_fqns = tuple(n for n, _ in named_buffers)
    # frozen parameters are placeholders too (not graph constants), placed like any other
    trainable = [i for i, (_, p) in enumerate(named_params) if p.requires_grad]
    params = [_to_fake(p, mode, p.requires_grad, param_dtype) for _, p in named_params]
    buffers = [_to_fake(b, mode, False) for _, b in named_buffers]
    with mode:
        input_keys, inputs = flatten_inputs(call_input_fn(input_fn))
    check_forward_accepts(model, input_keys)
    inputs = tuple(mode.from_tensor(x) if not _is_fake(x) else x for x in inputs)

    def forward(
        ps: Sequence[torch.Tensor], bs: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]
    ) -> tuple[list[Any], pytree.TreeSpec | None]:
        """The output's pytree leaves and structure (the loss alone under ``loss_fn``)."""
        state = dict(zip(param_fqns, ps, strict=True)) | dict(zip(buffer_fqns, bs, strict=True))
        if param_dtype is not None:  # FSDP2 casts floating inputs too (cast_forward_inputs)
            xs = [x.to(param_dtype) if x.is_floating_point() else x for x in xs]
        args, kwargs = call_form(input_keys, xs)
        try:
            out = functional_call(model, state, args, kwargs)
        except PlanError:
            raise
        except Exception as exc:  # the model's own code on these inputs, or a data-dependent op
            raise forward_failed(exc, model, input_keys, xs) from exc
        if loss_fn is not None:
            return [call_loss_fn(loss_fn, out)], None
        return pytree.tree_flatten(out)

    seen: dict[str, Any] = {}  # what the traced forward returned, read after the trace

    def step(
        ps: Sequence[torch.Tensor], bs: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], tuple[torch.Tensor | None, ...]]:
        leaves, spec = forward(ps, bs, xs)
        outs = [x for x in leaves if isinstance(x, torch.Tensor)]
        differentiable = [i for i, x in enumerate(outs) if x.requires_grad]
        if not differentiable:
            raise no_backward(model, leaves, outs, with_loss=loss_fn is not None)
        # one cotangent input per differentiable output, known once the forward has run
        ts = [late_input(outs[i], f"{TANGENT_PREFIX}{k + 1}") for k, i in enumerate(differentiable)]
        seen.update(leaves=leaves, spec=spec, outs=outs, differentiable=differentiable)
        found = torch.autograd.grad(
            [outs[i] for i in differentiable], [ps[i] for i in trainable], ts, allow_unused=True
        )
        grads: list[torch.Tensor | None] = [None] * len(ps)
        for i, g in zip(trainable, found, strict=True):
            grads[i] = g
        return outs, tuple(grads)

    with isolated_trace(), mode:  # a caller's CommDebugMode or profiler must not change it
        with marked_layers(model):
            gm = make_fx(step)(params, buffers, list(inputs))
    return _Recorded(gm, (param_fqns, buffer_fqns), input_keys, len(inputs), seen)


def _inputs_first(gm: fx.GraphModule) -> None:
    """Move the cotangent placeholders :func:`~autoplan.core.torch_adapter.late_input` made
    mid-trace to follow the other inputs, in order, and give the module a flat signature
    (``forward(*params, *buffers, *inputs, *cotangents)``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    late = [n for n in placeholders if n.name.startswith(TANGENT_PREFIX)]
    last = next(n for n in reversed(placeholders) if n not in late)
    for node in reversed(late):
        last.append(node)
    gm.graph.set_codegen(fx.graph.CodeGen())


def _refuse_constants(gm: fx.GraphModule, model: nn.Module) -> None:
    """A tensor the forward holds outside its parameters, buffers and inputs becomes a
    graph constant, which no stage places: refuse it by name before planning."""
    constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
    if not constants:
        return
    first = constants[0]
    if first.name.startswith("_param_constant"):
        raise PlanError(
            f"{type(model).__name__}'s forward reads a parameter of shape "
            f"{tuple(first.meta['val'].shape) if 'val' in first.meta else '?'} that is not "
            "registered in it (not in model.named_parameters(), e.g. held in a plain list "
            "or another model), so no plan can place it. Register it as a parameter of a "
            "submodule (nn.ModuleList, nn.ParameterList) or pass it as an input."
        )
    users = ", ".join(sorted({str(u.target) for c in constants for u in c.users}))
    shape = tuple(first.meta["val"].shape) if "val" in first.meta else "?"
    hint = (
        " It keeps a KV cache: set model.config.use_cache = False for training."
        if getattr(getattr(model, "config", None), "use_cache", False)
        else " Build such tensors from the inputs or register them as buffers."
    )
    raise PlanError(
        f"{type(model).__name__}'s forward creates {len(constants)} tensor constant(s) "
        f"(the first of shape {shape}, read by {users}) that are neither parameters, "
        f"buffers nor inputs, so no plan can place them.{hint}"
    )


@contextlib.contextmanager
def _paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector during the trace, then restore it.

    Tracing keeps several GC-tracked objects per node alive (fake tensors, proxies,
    nodes), so generation-1/2 passes rescan a growing heap of live objects. Short-lived
    cyclic garbage made meanwhile is reclaimed by the first collection after
    ``gc.enable()`` (Python docs, ``gc.disable``).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)
