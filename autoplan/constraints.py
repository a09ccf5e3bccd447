"""User pins: fix the placement of named parameters or graph nodes before the ILP.

Input: the traced graph, its strategy table and ``pins``, a mapping from a
parameter's FQN (``layers.0.attention.wq.weight``) or a graph node's name
(``einsum_default``) to a placement (``"S(0)S(0)"`` or a tuple of DTensor
placements). Output: a mask of allowed strategies per pinned node, which the
planner adds to the input and output constraints, and :func:`untie`, which
takes pinned nodes out of layer tying.

Why: users often know part of the answer (keep the embedding replicated,
shard this weight like Megatron) and want the solver to plan the rest around
it. A pin is an exact constraint on the node's output placement; every name
and placement is checked here so a typo is a clear error, not an ignored pin.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autoplan.errors import PlanError
from autoplan.placements import Placements, fmt, parse
from autoplan.strategies.table import StrategyTable
from autoplan.trace import TracedGraph

PinSpec = Sequence[Any] | str


def _placements(spec: PinSpec, num_axes: int, where: str) -> Placements:
    try:
        if isinstance(spec, str):
            return parse(spec, num_axes)
    except ValueError as exc:
        raise PlanError(f"{where}: {exc}") from exc
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
        mask = np.array([s.outs[0] == want for s in ns.strategies], dtype=bool)
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
