"""Stage 7b, execute: run a plan's joint graph on DTensors, node by node, as planned.

Input: the model's joint forward+backward graph (traced again, exactly as the planner
traced it), the :class:`~autoplan.result.plan.Plan` and a real ``DeviceMesh``. Output: the
graph's outputs and one gradient per parameter, as DTensors, with every intermediate
tensor placed the way the plan's ``node_placements`` say.

Why: DTensor's own dispatch, given DTensor parameters, picks the placement of every
activation by itself, so the collectives it runs need not be the ones the plan priced.
Here, before each op, every tensor input is redistributed to the placement the chosen
strategy requires (the priced redistribution, through the placements of its planned
route when the plan lists one), then the op runs through DTensor's
dispatch, which with inputs already placed needs no further communication. An op
DTensor has no rule for (the fused CPU attention kernels), and an mm-family op planned on
strided shards (``STRIDED_LOCAL_OPS``), run on the local shards and their outputs are
wrapped with the planned placements: the rules are checked by execution in the tests.
If DTensor ever produces another output placement than
planned, the value is moved to the planned one and the node is recorded in
:attr:`PlannedGraph.deviations` (a test asserts there are none).

Flattened meshes: DTensor runs ``S(0)S(0) -> RR`` as one all-gather over the flattened
group only when that flattened mesh exists, so :func:`flatten_mesh_groups` creates one
for every run of adjacent axes, as the cost model assumes.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autoplan.core.errors import PlanError
from autoplan.core.graph import arg_int, arg_node, map_args, source_name, tensor_args
from autoplan.core.placements import Placements, fmt, is_strided, made_by_op_only, plain, same
from autoplan.core.torch_adapter import flatten_axes, redistribute
from autoplan.result.plan import Plan
from autoplan.result.records import Slot
from autoplan.runtime.layout import as_traced
from autoplan.strategies.ops import MM_FAMILY
from autoplan.trace.capture import TracedGraph

# Ops run on local shards even though DTensor has a rule for them. DTensor runs
# ``einsum`` by decomposing it into views and a bmm, and its view rule cannot carry a
# dim sharded on two axes through the merge of batch dims (it makes a _StridedShard it
# then refuses to unflatten), while the einsum strategy itself is checked by running it
# on local shards (tests/integration/test_strategy_execution.py): so it runs the same way here.
LOCAL_OPS = frozenset({torch.ops.aten.einsum.default})
# The mm family runs on local shards too when a planned input is strided (split factor
# above 1). DTensor's view rule labels its strided outputs with an explicit shard order
# and a redistributed tensor carries none; given one of each (``S(1)_S(1,2) x
# S(0)_S(0,2) -> PP``, the weight gradient of a flattened batch), DTensor's mm dispatch
# gathers both to R and makes RR, unpriced (tests/integration/test_apply.py). The strategy itself
# is DTensor's own, checked on local shards (tests/integration/test_strategy_execution.py).
STRIDED_LOCAL_OPS = MM_FAMILY

__all__ = ["PlannedGraph", "collective_counts", "flatten_mesh_groups", "move", "op_name"]

_KINDS = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_to_all_single": "all_to_all",
    "shard_dim_alltoall": "all_to_all",
}


def collective_counts(comm_counts: dict[Any, int]) -> dict[str, int]:
    """``CommDebugMode.get_comm_counts()`` in the plan's vocabulary (``plan.comm``'s kinds).

    Compare it with ``{k: v.count for k, v in plan.comm.items()}`` to check that one
    training step ran exactly the collectives the plan priced.
    """
    out: dict[str, int] = {}
    for op, n in comm_counts.items():
        name = str(op).split(".")[-1]
        kind = _KINDS.get(name, name)
        out[kind] = out.get(kind, 0) + n
    return out


def flatten_mesh_groups(mesh: DeviceMesh) -> list[DeviceMesh]:
    """Create the flattened mesh of every run of >= 2 adjacent axes of ``mesh``.

    DTensor fuses consecutive same-kind collectives on those axes into one collective
    over the flattened group (``_redistribute._optimize_transform_infos``), which is
    how autoplan's cost model prices them. Idempotent.
    """
    names = mesh.mesh_dim_names or tuple(f"axis{i}" for i in range(mesh.ndim))
    out = []
    for lo, hi in itertools.combinations(range(mesh.ndim + 1), 2):
        if hi - lo < 2:
            continue
        out.append(flatten_axes(mesh, names[lo:hi]))
    return out


@dataclass(frozen=True)
class _Step:
    node: fx.Node
    ins: tuple[Placements | None, ...]
    outs: tuple[Placements | None, ...]
    # per tensor input, the placements its move passes on the way (plan.routes)
    via: tuple[tuple[Placements, ...], ...]
    local: bool  # run on local shards (LOCAL_OPS, or STRIDED_LOCAL_OPS on strided inputs)


class PlannedGraph:
    """The joint graph with the plan's placement for every tensor input and output.

    Raises ``ValueError`` when the graph and the plan disagree (another model, another
    ``mm_mode``, another batch shape): the plan must have a placement for every node.
    """

    def __init__(
        self,
        traced: TracedGraph,
        plan: Plan,
        mesh: DeviceMesh,
        *,
        reduce_dtype: torch.dtype | None = None,
    ) -> None:
        self.traced, self.plan, self.mesh = traced, plan, mesh
        self.reduce_dtype = reduce_dtype
        self.deviations: list[str] = []
        missing, wrong_op = [], []
        self._steps: list[_Step] = []
        self._outs: dict[str, tuple[Placements | None, ...]] = {}
        for node in traced.gm.graph.nodes:
            if node.op == "output":
                continue
            source = source_name(node)  # a recomputed copy runs as its original
            entry = plan.node_placements.get(source)
            op = op_name(node)
            if entry is None:
                missing.append(node.name)
                continue
            if entry.op != op:
                wrong_op.append(f"{node.name} ({op}, plan: {entry.op})")
                continue
            outs = self._outs[node.name] = entry.out
            ins = entry.inputs
            via = tuple(plan.routes.get(Slot(source, k), ()) for k in range(len(ins)))
            local = node.target in LOCAL_OPS or (
                node.target in STRIDED_LOCAL_OPS and any(map(_strided, ins))
            )
            self._steps.append(_Step(node, ins, outs, via, local))
        if missing or wrong_op:
            raise PlanError(
                f"the plan does not fit this model's graph: {len(missing)} nodes have no planned "
                f"placement (first: {missing[:3]}) and {len(wrong_op)} differ in op (first: "
                f"{wrong_op[:3]}). Plan this exact model, mm_mode and input shapes, then apply "
                "that plan."
            )

    def planned_output(self, name: str) -> Placements:
        """The plan's placement of node ``name``'s (first) output."""
        want = self._outs[name][0]
        if want is None or made_by_op_only(want):
            raise NotImplementedError(
                f"the plan places output {name} as {fmt(want)}, which a caller cannot be handed; "
                "plan with output_placements to fix the output's placement."
            )
        return want

    def run(
        self,
        params: Sequence[DTensor],
        buffers: Sequence[DTensor],
        inputs: Sequence[DTensor],
        tangents: Sequence[DTensor | Callable[[], DTensor]],
    ) -> tuple[list[DTensor], dict[str, DTensor]]:
        """Execute the graph; return the outputs and the gradient of each parameter FQN.

        ``tangents`` are the cotangents of the differentiable outputs (``traced.tangents``
        order), placed where they arrive (:func:`autoplan.core.placements.cotangent_placements` of the
        output's planned placement), or functions making them; each is made and moved to
        its planned placement just before the first op that reads it (the cotangent edge
        the cost model prices), so that a recorded step does all of the backward's work
        after the forward's.

        Each gradient is moved to its parameter's placement (the edge the cost model
        prices from the gradient node to the parameter: the optimizer updates shard by
        shard) as soon as it is computed, so that a lowered step can reduce it while the
        backward goes on.
        """
        t = self.traced
        env: dict[str, Any] = {}
        feed = dict(zip(t.params, params, strict=True))
        feed |= dict(zip(t.buffers, buffers, strict=True))
        feed |= dict(zip(t.inputs, inputs, strict=True))
        pending = dict(zip(t.tangents.values(), tangents, strict=True))
        param_of = dict(zip(t.param_fqns, t.params, strict=True))
        grad_of: dict[str, list[str]] = {}
        for fqn, name in t.grads.items():
            grad_of.setdefault(name, []).append(fqn)
        grads: dict[str, DTensor] = {}
        for step in self._steps:
            node = step.node
            if node.op == "placeholder":
                if node.name not in pending:
                    env[node.name] = self._place(feed[node.name], step.outs[0], node.name)
            else:
                for arg in node.all_input_nodes:
                    if arg.name in pending:
                        given = pending.pop(arg.name)
                        value = given() if callable(given) else given
                        env[arg.name] = self._place(value, self._outs[arg.name][0], arg.name)
                env[node.name] = self._call(step, env)
            for fqn in grad_of.get(node.name, ()):
                grads[fqn] = self._place(
                    self._for_reduction(env[node.name]),
                    self._outs[param_of[fqn]][0],
                    f"gradient of {fqn}",
                )
        return [env[o] for o in t.outputs], {fqn: grads[fqn] for fqn in t.grads}

    def _for_reduction(self, grad: Any) -> Any:
        """A partial gradient in ``reduce_dtype`` (FSDP2's policy), as the plan priced it."""
        if self.reduce_dtype is None or not isinstance(grad, DTensor):
            return grad
        if any(p.is_partial() for p in grad.placements):
            return grad.to(self.reduce_dtype)
        return grad

    # -- one node -----------------------------------------------------------------

    def _call(self, step: _Step, env: dict[str, Any]) -> Any:
        node = step.node
        if node.target is operator.getitem:
            return env[arg_node(node, 0).name][arg_int(node, 1)]
        placed = {
            a.name: self._place(
                env[a.name], want, f"{node.name} input {a.name}", via, a.meta.get("val")
            )
            for a, want, via in zip(tensor_args(node), step.ins, step.via, strict=True)
        }
        args, kwargs = map_args((node.args, dict(node.kwargs)), lambda n: placed[n.name])
        if step.local:
            return self._call_local(step, args, kwargs)
        fn = node.target
        assert callable(fn), f"{node.name} is a call_function node"
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError as err:
            if "sharding strategy" not in str(err):
                raise
            out = self._call_local(step, args, kwargs)
        return self._check_outputs(step, out)

    def _call_local(self, step: _Step, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run an op on local shards (no DTensor rule, or in ``LOCAL_OPS``); wrap outputs as planned."""
        local_args, local_kwargs = _map_tensors(
            (args, kwargs), lambda x: x.to_local() if isinstance(x, DTensor) else x
        )
        fn = step.node.target
        assert callable(fn), f"{step.node.name} is a call_function node"
        out = fn(*local_args, **local_kwargs)
        vals = step.node.meta["val"]
        if isinstance(out, torch.Tensor):
            return self._wrap(out, step.outs[0], vals)
        return type(out)(
            self._wrap(o, want, v) if isinstance(o, torch.Tensor) else o
            for o, want, v in zip(out, step.outs, vals, strict=True)
        )

    def _wrap(self, local: torch.Tensor, want: Placements | None, val: Any) -> DTensor:
        if want is None or made_by_op_only(want):
            raise NotImplementedError(
                f"cannot wrap a local result as {fmt(want)}: the plan places the output of an op "
                "DTensor has no rule for in a placement only DTensor ops can make."
            )
        return DTensor.from_local(
            local, self.mesh, want, run_check=False, shape=val.shape, stride=val.stride()
        )

    def _check_outputs(self, step: _Step, out: Any) -> Any:
        if isinstance(out, (tuple, list)):
            return type(out)(
                self._settle(o, want, step.node.name)
                for o, want in zip(out, step.outs, strict=True)
            )
        return self._settle(out, step.outs[0], step.node.name)

    def _settle(self, value: Any, want: Placements | None, where: str) -> Any:
        if want is None or not isinstance(value, torch.Tensor):
            return value
        if not isinstance(value, DTensor) or _same(value.placements, want):
            return self._place(value, want, where)
        self.deviations.append(f"{where}: DTensor made {fmt(value.placements)}, plan {fmt(want)}")
        return self._place(value, want, where)

    def _place(
        self,
        value: Any,
        want: Placements | None,
        where: str,
        via: Sequence[Placements] = (),
        traced: object = None,
    ) -> Any:
        """``value`` redistributed to ``want`` through the placements ``via`` (the planned
        route), one redistribution per hop; a plain tensor counts as replicated. A moved
        shard is laid out as ``traced`` (the value's fake tensor) was, when given."""
        if want is None or not isinstance(value, torch.Tensor):
            return value
        if not isinstance(value, DTensor):
            value = DTensor.from_local(value, self.mesh, [Replicate()] * self.mesh.ndim)
        if made_by_op_only(want):  # only the producing op makes it: nothing to move
            if _same(value.placements, want):
                return value
            raise RuntimeError(
                f"{where}: the plan wants {fmt(want)}, which only the producing op can make, but the "
                f"value is {fmt(value.placements)}."
            )
        if tuple(value.placements) == want:
            return value
        for hop in via:
            value = move(value, self.mesh, hop)
        return as_traced(move(value, self.mesh, want), traced)


def move(value: DTensor, mesh: DeviceMesh, want: Placements) -> DTensor:
    """One planned move of ``value`` to ``want``, as the cost model prices it.

    ``_S(d,1)`` is ``S(d)`` (:func:`autoplan.core.placements.plain`): the move runs between the
    plain spellings, and changing spelling relabels the local shard, with no collective.
    torch 2.13's redistribute runs its strided path for ``_S(d,1)``: ``S(0)_S(0,1) ->
    S(0)S(1)`` gathers where ``S(0)S(0) -> S(0)S(1)`` is one all-to-all, so a move with an
    ``_S(d,1)`` on either side can run other collectives than priced through redistribute,
    and runs the priced ones through this function (tests/integration/test_redistribute_execution.py).
    """
    have, target = tuple(value.placements), plain(want)
    if have != plain(have):
        value = _relabel(value, mesh, plain(have))
    if tuple(value.placements) != target:
        value = redistribute(value, mesh, target)
    if target != want:
        value = _relabel(value, mesh, want)
    return value


def _relabel(value: DTensor, mesh: DeviceMesh, placements: Placements) -> DTensor:
    """The same shards under another spelling of their layout (no collective)."""
    return DTensor.from_local(
        value.to_local(), mesh, placements, run_check=False, shape=value.shape,
        stride=value.stride(),
    )  # fmt: skip


def _same(have: Sequence[Any], want: Placements) -> bool:
    """Whether ``have`` is the planned layout (``_S(d,1)`` and ``S(d)`` are one layout; a
    masked partial compared by its short form, :func:`autoplan.core.placements.same`)."""
    if made_by_op_only(want):
        return same(tuple(have), want)
    return plain(tuple(have)) == plain(want)


def _strided(want: Placements | None) -> bool:
    """Whether a planned placement has a ``_StridedShard`` of split factor above 1."""
    return want is not None and any(is_strided(p) for p in plain(want))


def op_name(node: fx.Node) -> str:
    """A node's op as a plan's ``node_placements`` records it."""
    if node.op == "placeholder":
        return "placeholder"
    if node.target is operator.getitem:
        return "getitem"
    return str(node.target)


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map_tensors(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj
