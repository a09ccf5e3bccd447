"""Read a saved plan back: its JSON through the plan's codec, then the checks across fields.

Input: a plan file's path (:func:`read_text`) or its JSON text (:func:`read_plan`).
Output: the :class:`~autoplan.result.plan.Plan`, or a :class:`~autoplan.core.errors.PlanError`
naming the file, the key (``param_placements["layers.0.attention.wq.weight"]``), its
value, what a valid value looks like and how to get a new plan.

Why its own module: a plan JSON is a file people edit, copy between runs and keep. Each
value's type is checked by the codec that wrote it (:data:`autoplan.result.records.CODEC`);
what no one field's type can say is checked here: the mesh (distinct axis names, one per
size), one placement per mesh axis everywhere, sharded dims within the recorded shapes of
the parameters and inputs, node names wherever another field refers to a node, and the
config's options as :class:`~autoplan.core.config.PlanConfig` takes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.core import user_files
from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError
from autoplan.core.json_errors import ABSENT, DecodeError, describe, fail, read_json
from autoplan.core.json_errors import Path as KeyPath
from autoplan.core.placements import Placements, fmt, sharded_dim
from autoplan.result.records import CODEC

if TYPE_CHECKING:
    from autoplan.result.plan import Plan

INPUT_PREFIX = "xs_"  # trace_joint names the model's inputs xs_1, xs_2, ...


def read_text(path: str | Path) -> str:
    """The text of the plan file at ``path``; a PlanError naming the path if it cannot be read."""
    how = "give the path of a plan file written by: autoplan plan RUN.yaml --out PLAN.json"
    return user_files.read_text(path, what="plan file", how=how)


def read_plan(cls: type[Plan], text: str, *, source: str, out: str = "PLAN.json") -> Plan:
    """The plan in ``text``, read through the codec and checked across fields. ``source``
    names the plan in messages (its path); ``out`` is where the fix's ``autoplan plan``
    writes a new one."""
    try:
        data = read_json(text)
        if not isinstance(data, dict):
            kind = "an array" if isinstance(data, list) else f"a JSON {type(data).__name__}"
            raise DecodeError(None, None, f"holds {kind}, not a plan object", "restore it")
        plan = CODEC.decode(data, cls)
        check(plan)
    except DecodeError as exc:
        raise PlanError(
            f"{source}: {describe(exc.path, exc.value)} {exc.problem}. Fix: {exc.valid}; or "
            f"re-plan with `autoplan plan RUN.yaml --out {out}`"
        ) from None
    return plan


def check(plan: Plan) -> None:
    """Raise a DecodeError at the first value that contradicts another field of ``plan``."""
    _mesh(plan)
    for name in ("objective_us", "compute_us", "comm_us"):
        value = getattr(plan, name)
        if plan.status != "infeasible" and not math.isfinite(value):
            problem = "is not finite (null: no cost, which only an infeasible plan has)"
            fail((name,), value, problem, "give a finite number, e.g. 0.0")
    _config(plan.config)
    _params(plan)
    axes = _Axes(plan)
    for name, entry in plan.node_placements.items():
        for side, placed in (("out", entry.out), ("in", entry.inputs)):
            for i, p in enumerate(placed):
                axes.check(("node_placements", name, side, i), p)
    _inputs(plan, axes)
    _steps(plan, axes)


def _mesh(plan: Plan) -> None:
    sizes, names = plan.mesh_shape, plan.axis_names
    if not sizes:
        fail(("mesh_shape",), [], "is empty", "give one size per mesh axis, e.g. [2, 4]")
    valid = 'give each mesh axis its own name, e.g. ["dp", "tp"]'
    if len(names) != len(sizes):
        fail(("axis_names",), list(names), f"names {len(names)} axes, not {len(sizes)}", valid)
    for i, name in enumerate(names):
        if not name:
            fail(("axis_names", i), name, "is not a non-empty string", valid)
        if name in names[:i]:
            fail(("axis_names", i), name, "names two axes", valid)


class _Axes:
    """Checks placements against the plan's mesh: one per axis, sharding only dims a
    recorded shape has."""

    def __init__(self, plan: Plan) -> None:
        self.num_axes, self.names = len(plan.mesh_shape), plan.axis_names
        self.example = f'"{"R" * self.num_axes}" (replicated) or "S(0){"R" * (self.num_axes - 1)}"'

    def check(
        self, path: KeyPath, placed: Placements | None, shape: Sequence[int] | None = None
    ) -> None:
        if placed is None:
            return
        if len(placed) != self.num_axes:
            axes = f"{self.num_axes} axes ({', '.join(self.names)})"
            problem = f"has {len(placed)} placements but the mesh has {axes}"
            fail(
                path, fmt(placed), problem, f"give one placement per mesh axis, e.g. {self.example}"
            )
        if shape is None:
            return
        for p in placed:
            d = sharded_dim(p)
            if d is not None and d >= len(shape):
                problem = f"shards dim {d} of a tensor with {len(shape)} dims {list(shape)}"
                dims = f"dims 0..{len(shape) - 1}" if shape else "no dim (a scalar)"
                fail(path, fmt(placed), problem, f"shard {dims}, e.g. {self.example}")


def _config(config: dict[str, Any]) -> None:
    """Each option as :class:`~autoplan.core.config.PlanConfig` accepts it."""
    options = [f.name for f in fields(PlanConfig)]
    for name, value in config.items():
        path = ("config", name)
        if name not in options:
            fail(path, value, "is not a plan option", f"options: {', '.join(options)}")
        if name == "topology":  # recorded by its device name
            if not isinstance(value, str):
                fail(path, value, "is not a string", 'give a string, e.g. ""')
            continue
        try:
            PlanConfig(**{name: value})
        except (PlanError, TypeError) as exc:
            fail(path, value, "is not a valid value", str(exc).rstrip("."))


def _params(plan: Plan) -> None:
    shapes, placed = plan.param_shapes, plan.param_placements
    axes = _Axes(plan)
    for fqn, p in placed.items():
        path = ("param_placements", fqn)
        if shapes and fqn not in shapes:
            fail(path, fmt(p), "places a parameter param_shapes lacks", "remove it")
        axes.check(path, p, shapes.get(fqn))
    unplaced = [fqn for fqn in shapes if fqn not in placed]
    if unplaced and plan.status != "infeasible":
        path = ("param_placements", unplaced[0])
        fail(path, ABSENT, "param_shapes lists the parameter", "give its placements")


def _inputs(plan: Plan, axes: _Axes) -> None:
    """Each input's shape and key; its placements shard only the dims its shape has."""
    shapes, keys, nodes = plan.input_shapes, plan.input_keys, plan.node_placements
    if keys and len(keys) != len(shapes):
        problem = f"has {len(keys)} keys for {len(shapes)} input_shapes"
        fail(("input_keys",), list(keys), problem, "give one key per input")
    placed = [n for n in nodes if n.startswith(INPUT_PREFIX)]
    if shapes and placed and len(placed) != len(shapes):
        problem = f"lists {len(shapes)} inputs but node_placements places {len(placed)}"
        fail(("input_shapes",), [list(s) for s in shapes], problem, "give one shape per input")
    for i, shape in enumerate(shapes if placed else ()):
        entry = nodes.get(f"{INPUT_PREFIX}{i + 1}")
        if entry is not None and entry.out:
            axes.check(("node_placements", f"{INPUT_PREFIX}{i + 1}", "out", 0), entry.out[0], shape)


def _steps(plan: Plan, axes: _Axes) -> None:
    """The routes, recomputed nodes and buckets: each names graph nodes or collectives."""
    nodes = plan.node_placements
    for (node, slot), via in plan.routes.items():
        path: KeyPath = ("routes", f"{node}:{slot}")
        if node not in nodes or slot >= len(nodes[node].inputs):
            valid = 'key a route "node:slot" with a node of node_placements, e.g. "mm:0"'
            fail(
                path, [fmt(p) for p in via], "is not keyed by a planned node and input slot", valid
            )
        for i, p in enumerate(via):
            axes.check((*path, i), p)
    for i, name in enumerate(plan.recompute):
        if name not in nodes:
            fail(
                ("recompute", i),
                name,
                "is not a planned node",
                "list only nodes of node_placements",
            )
    for i, (_, _, kind_axes) in enumerate(plan.shared_launches):
        for a, axis in enumerate(kind_axes):
            if axis >= axes.num_axes:
                valid = f"give a mesh axis in 0..{axes.num_axes - 1}"
                fail(("shared_launches", i, 2, a), axis, "is not a mesh axis", valid)
    for i, b in enumerate(plan.buckets):
        if b.kind not in plan.comm:
            allowed = ", ".join(f'"{k}"' for k in sorted(plan.comm))
            fail(("buckets", i, "kind"), b.kind, "is not allowed", f"give one of {allowed}")
        for a, axis in enumerate(b.axes):
            if axis >= axes.num_axes:
                valid = f"give a mesh axis in 0..{axes.num_axes - 1}"
                fail(("buckets", i, "axes", a), axis, "is not a mesh axis", valid)
