"""Placement constraints: the user's inputs, outputs and pins as masks over strategies.

Stage 4 (between strategies and the ILP). Input: the traced graph, its strategy
table, ``input_placements``, ``output_placements`` and ``pins`` (a mapping from a
parameter's FQN, ``layers.0.attention.wq.weight``, or a graph node's name,
``einsum_default``, to a placement, ``"S(0)S(0)"`` or a tuple of DTensor
placements). Output: :func:`allowed_strategies`, a mask of allowed strategies per
constrained node and the set of pinned nodes; and :func:`untie`, which takes pinned
nodes out of layer tying.

Why: users often know part of the answer (the batch split over data parallelism, a
replicated loss, this weight sharded like Megatron) and want the solver to plan the
rest around it. Each constraint is exact; every name and placement is checked here
so that a typo is a clear error, not an ignored pin.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch.distributed.tensor import Placement

from autoplan.core.errors import PlanError
from autoplan.core.placements import Placements, fmt, parse, same
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

PlacementSpec = Sequence[Any] | str  # "S(0)R" or a tuple of DTensor placements
PinSpec = PlacementSpec
# one placement for every input, one per input, or one per keyword of input_fn's dict
InputPlacements = PlacementSpec | Sequence[PlacementSpec] | Mapping[str, PlacementSpec]


def _placements(spec: PlacementSpec, num_axes: int, where: str) -> Placements:
    """``spec`` (``"S(0)R"`` or a tuple of DTensor placements) as one placement per mesh
    axis; ``where`` names it in errors."""
    if isinstance(spec, str):
        try:
            return parse(spec, num_axes)
        except PlanError as exc:
            raise PlanError(f"{where}: {exc}") from exc
    if not isinstance(spec, Sequence):
        raise PlanError(
            f"{where} is {spec!r}: a placement is a string such as 'S(0)R' or a tuple of "
            "DTensor placements, one per mesh axis."
        )
    placements = tuple(spec)
    if len(placements) != num_axes:
        raise PlanError(
            f"{where} = {fmt(placements)} has {len(placements)} entries; "
            f"the mesh has {num_axes} axes, give one placement per axis."
        )
    return placements


def _node_of(name: str, traced: TracedGraph, table: StrategyTable) -> str:
    params = dict(zip(traced.param_fqns, traced.params, strict=True))
    if name in params:
        return params[name]
    if name in table.nodes:
        return name
    close = difflib.get_close_matches(name, [*params, *table.nodes], n=3, cutoff=0.6)
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise PlanError(
        f"pins: {name!r} is neither a parameter (FQN, e.g. {traced.param_fqns[0]!r}) nor a "
        f"node of the traced graph{hint}. `autoplan plan --json` lists the nodes."
    )


def resolve_pins(
    traced: TracedGraph, table: StrategyTable, pins: Mapping[str, PinSpec] | None
) -> dict[str, np.ndarray]:
    """For each pinned node, the mask of its strategies whose output is the pinned placement."""
    allowed: dict[str, np.ndarray] = {}
    num_axes = len(table.mesh_shape)
    for name, spec in (pins or {}).items():
        where = f"pins[{name!r}]"
        want = _placements(spec, num_axes, where)
        node = _node_of(name, traced, table)
        ns = table.nodes[node]
        mask = np.array([same(s.outs[0], want) for s in ns.strategies], dtype=bool)
        if not mask.any():
            shape = list(ns.out_tensors[0].shape) if ns.out_tensors[0] else "?"
            offered = sorted({fmt(s.outs[0]) for s in ns.strategies if s.outs[0] is not None})
            raise PlanError(
                f"{where} = {fmt(want)} is not a placement node {node} (shape {shape}) can take "
                f"on mesh {table.mesh_shape}; it can take: {', '.join(offered)}."
            )
        allowed[node] = allowed.get(node, mask) & mask
    return allowed


def untie(rep: Mapping[str, str], pinned: set[str]) -> dict[str, str]:
    """``rep`` with pinned nodes in classes of their own.

    A pin constrains one node, not its twins in other layers; the rest of a class
    is represented by its first unpinned member.
    """
    out: dict[str, str] = {}
    new_rep: dict[str, str] = {}
    for v, r in rep.items():  # graph order, as cluster() assigns representatives
        if v in pinned:
            out[v] = v
            continue
        out[v] = new_rep.setdefault(r, v)
    return out


def _constrain(
    table: StrategyTable,
    names: Sequence[str],
    specs: Sequence[PlacementSpec | None] | None,
    what: str,
) -> dict[str, np.ndarray]:
    allowed: dict[str, np.ndarray] = {}
    if specs is None:
        return allowed
    if len(specs) != len(names):
        noun = "input" if what == "input_placements" else "output tensor"
        raise PlanError(
            f"{what} lists {len(specs)} placements for the model's {len(names)} "
            f"{noun}{'s' if len(names) != 1 else ''}; give one per {noun} (None leaves one to "
            "the solver), or one placement such as 'S(0)R' for all."
        )
    num_axes = len(table.mesh_shape)
    for i, (name, spec) in enumerate(zip(names, specs, strict=True)):
        if spec is None:
            continue
        want = _placements(spec, num_axes, f"{what}[{i}]")
        ns = table.nodes[name]
        mask = np.array([same(s.outs[0], want) for s in ns.strategies])
        if not mask.any():
            shape = ns.out_tensors[0].shape if ns.out_tensors[0] else "?"
            raise PlanError(
                f"{what}[{i}] = {fmt(want)} is not possible for a tensor of shape {shape} on mesh "
                f"{table.mesh_shape}: a sharded dim must divide evenly by the mesh axes sharding it."
            )
        allowed[name] = mask
    return allowed


def _one_for_all(specs: Any, count: int) -> Any:
    """``specs`` repeated ``count`` times when it is one placement (``"S(0)R"`` or a tuple
    of DTensor placements), else as given."""
    if isinstance(specs, str) or (
        isinstance(specs, Sequence) and specs and all(isinstance(p, Placement) for p in specs)
    ):
        return [specs] * count
    return specs


def _inputs_by_key(
    specs: InputPlacements | None,
    keys: Sequence[int | str],
) -> Sequence[PlacementSpec | None] | None:
    """``input_placements`` as one entry per input in the graph's order (``None``: left to
    the solver). One placement (``"S(0)R"``) places every input alike, the batch split the
    same way for the token ids and their labels; a dict is keyed like ``input_fn``'s."""
    specs = _one_for_all(specs, len(keys))
    if not isinstance(specs, Mapping):
        return specs
    unknown = [k for k in specs if k not in keys]
    if unknown:
        known = ", ".join(repr(k) for k in keys if isinstance(k, str)) or "none (positional)"
        raise PlanError(
            f"input_placements names input {unknown[0]!r}, which input_fn does not return "
            f"(its keyword inputs: {known}); key the dict by input_fn's keys."
        )
    by_key: dict[int | str, PlacementSpec] = dict(specs.items())
    return [by_key.get(k) for k in keys]


def _scalars_replicated(traced: TracedGraph, num_axes: int) -> list[PlacementSpec | None]:
    """Every 0-dim output (a loss) replicated, the others free: each rank reads the loss
    it logs and steps on whole, never a partial sum."""
    return [
        "R" * num_axes if traced.node(n).meta["val"].ndim == 0 else None for n in traced.outputs
    ]


def allowed_strategies(
    traced: TracedGraph,
    table: StrategyTable,
    input_placements: InputPlacements | None,
    output_placements: Sequence[PlacementSpec] | None,
    pins: Mapping[str, PinSpec] | None,
) -> tuple[dict[str, np.ndarray], set[str]]:
    """Each constrained node's mask of allowed strategies (inputs, outputs, pins; a 0-dim
    output replicated unless ``output_placements`` says otherwise) and the pinned nodes,
    which the solver keeps out of merging and tying."""
    specs = _inputs_by_key(input_placements, traced.input_keys)
    allowed = _constrain(table, traced.inputs, specs, "input_placements")
    outputs: Sequence[PlacementSpec | None] | None = output_placements
    if outputs is None:
        outputs = _scalars_replicated(traced, len(table.mesh_shape))
    outputs = _one_for_all(outputs, len(traced.outputs))
    allowed |= _constrain(table, traced.outputs, outputs, "output_placements")
    pinned = resolve_pins(traced, table, pins)
    for node, mask in pinned.items():
        if node in allowed and not (allowed[node] & mask).any():
            raise PlanError(
                f"pins: node {node} is pinned to a placement its input or output "
                "placement constraint excludes; drop one of the two."
            )
        allowed[node] = allowed.get(node, mask) & mask
    return allowed, set(pinned)
