"""Stage 5a (reductions) for ``activation_checkpointing="auto"``: each layer's
checkpointing mode as part of its nodes' strategies, so the ILP chooses it per layer.

Input: the traced graph, its strategy table, the cost table without recomputation and
its follower reduction (:mod:`autoplan.ilp.reductions.followers`, run with
:func:`mode_boundary` kept apart). Output: a :class:`ModeChoice`: the reduced cost table
in which every root holding a layer's forward node has its strategies once per mode
(strategy ``i`` of mode ``k`` is ``k * n + i``), and the map back to a strategy per node
and a mode per layer.

Why: which values a layer keeps and which it computes again decide both the step's
time and its memory, and the best trade under a budget can differ between layers
(recompute some, keep the rest). As strategies, the modes go through tying, pruning,
the relaxation, untying and the solve like placements do; a layer's copies are tied
to one mode and split by the untie stage when the budget pays for it.

How, exactly priced: which nodes a layer recomputes depends on its own mode only
(:func:`autoplan.memory.recompute.recompute_set`). Under mode k a root's compute adds each of
its members' compute that k recomputes, and the second run of the moves into them
(an edge a follower was merged through is free at every strategy, one folded into its
root is added there), and an edge into a recomputed member costs twice under k. The
modes of one layer agree through the edges between its roots whose destination some
mode recomputes, taken as block diagonal (a route-priced one stays a flow, over a
network with a copy of its states per mode), and a zero-cost link between their
components where those do not join them. A root keeps, under k, what k keeps of its
members at that mode; a value another layer reads stays counted in every mode (the
other layer's copies may read it), a value outside every layer in all modes where any
mode keeps it: the memory row is never below the true kept bytes, and equal to them
where the values other layers read are read by the backward anyway (LLaMA's residual
stream). An output's gradient the backward holds
(:func:`~autoplan.memory.activations.cotangent_memory`) is counted in every mode. The
plan is then read out of the exact per-layer recomputation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
from torch import fx

from autoplan.core.by_identity import ByIdentity
from autoplan.core.by_value import ByValue
from autoplan.core.components import components
from autoplan.core.config import CHECKPOINT_MODES
from autoplan.core.graph import forward_part, layer_of
from autoplan.cost.block_diagonal import BlockDiagonal
from autoplan.cost.mode_routes import ModeRoutes
from autoplan.cost.price import CostTable, EdgeCost
from autoplan.cost.routes import Routes
from autoplan.ilp.reductions.followers import FOLDED, FOLLOWED, Reduction
from autoplan.memory.activations import activation_memory, cotangent_memory, storage_root
from autoplan.memory.recompute import recompute_set
from autoplan.strategies.table import StrategyTable
from autoplan.trace.capture import TracedGraph

__all__ = ["LINK_SLOT", "ModeChoice", "layer_modes", "mode_boundary"]

LINK_SLOT = -3  # the slot of a zero-cost edge that only keeps a layer's modes equal


@dataclass(frozen=True)
class ModeChoice:
    """The cost table with modes in it; ``widths[r]`` is the number of root r's own
    strategies where r has a copy of them per mode, ``layers[r]`` its layer."""

    costs: CostTable
    widths: dict[str, int]
    layers: dict[str, str]
    modes: tuple[str, ...]

    def split(self, choice: dict[str, int]) -> tuple[dict[str, int], dict[str, str]]:
        """A strategy per node of the reduced table, and the mode of each layer."""
        own: dict[str, int] = {}
        modes: dict[str, str] = {}
        for v, i in choice.items():
            n = self.widths.get(v)
            if n is None:
                own[v] = i
                continue
            k, own[v] = divmod(i, n)
            if modes.setdefault(self.layers[v], self.modes[k]) != self.modes[k]:
                raise AssertionError(f"layer {self.layers[v]} has two modes in one plan")
        return own, modes

    def allowed(self, masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Strategy masks of the reduced table, each repeated per mode where r has modes."""
        k = len(self.modes)
        return {v: np.tile(m, k) if v in self.widths else m for v, m in masks.items()}


def mode_boundary(traced: TracedGraph) -> set[str]:
    """The forward nodes of a layer that read a value from outside it, but views: kept
    out of follower merging, so a root holds the nodes of one layer, or of none, and
    views of another layer's values (free to recompute: no compute, no move). A view
    stays a follower: moved, it would own its storage where the kept bytes count its
    base's."""
    forward = _forward(traced)
    return {
        n.name
        for n in forward
        if (layer := layer_of(n)) is not None
        and not getattr(n.target, "is_view", False)
        and any(a in forward and layer_of(a) != layer for a in n.all_input_nodes)
    }


def layer_modes(
    traced: TracedGraph,
    table: StrategyTable,
    costs: CostTable,
    reduction: Reduction,
    modes: tuple[str, ...] = CHECKPOINT_MODES,
) -> ModeChoice:
    """``reduction.costs`` with each layer's mode in its roots' strategies (see the module
    docstring); the memory row counts the kept activations of each mode."""
    forward = _forward(traced)
    layer = {n.name: lay for n in forward if (lay := layer_of(n)) is not None}
    chosen = [recompute_set(traced, m) for m in modes]
    again = [set(names) for names in chosen]
    kept = [activation_memory(traced, table, names) for names in again]
    held = cotangent_memory(traced, table)  # the outputs' gradients, in every mode
    crossing = {
        storage_root(n).name
        for n in forward
        if n.name in layer and any(u in forward and layer_of(u) != layer[n.name] for u in n.users)
    }

    def kept_bytes(m: str, k: int) -> np.ndarray | None:
        if m in layer and m not in crossing:
            return kept[k].get(m)
        if m in again[k]:
            return None
        return next((found[m] for found in kept if m in found), None)

    reduced = reduction.costs
    members: dict[str, list[tuple[str, np.ndarray | None]]] = defaultdict(list)
    for v in costs.compute:
        root, mapping = reduction.root_of(v)
        members[root].append((v, mapping))
    views = {n.name for n in forward if getattr(n.target, "is_view", False)}
    layers: dict[str, str] = {}
    for r, group in members.items():
        found = {layer[v] for v, _ in group if v in layer and (v == r or v not in views)}
        if len(found) > 1:
            raise AssertionError(f"{r} holds nodes of layers {sorted(found)}")
        if found:
            layers[r] = found.pop()
    widths = {r: len(reduced.compute[r]) for r in layers}
    count = len(modes)

    def at(mapping: np.ndarray | None, a: np.ndarray) -> np.ndarray:
        return a if mapping is None else a[mapping]

    folded: dict[str, list[EdgeCost]] = defaultdict(list)  # per root, its folded edges
    original_dst: dict[int, str] = {}  # reduced edge -> the node it entered before merging
    for e, fate in zip(costs.edges, reduction.fates, strict=True):
        if fate == FOLDED:
            folded[reduction.root_of(e.dst)[0]].append(e)
        elif fate != FOLLOWED:
            original_dst[fate] = e.dst

    compute: dict[str, np.ndarray] = dict(reduced.compute)
    pool = ByValue()  # twin layers' roots: one array for all of them
    memory: dict[str, np.ndarray] = dict(reduced.memory)
    for r, group in members.items():
        parts = []
        for k in range(count if r in widths else 1):
            time = reduced.compute[r].copy()
            mem = reduced.memory[r].copy() if r in reduced.memory else np.zeros_like(time)
            for v, mapping in group:
                if v in again[k]:
                    time += at(mapping, costs.compute[v])
                kept_here = kept_bytes(v, k)
                if kept_here is not None:
                    mem += at(mapping, kept_here)
                if v in held:
                    mem += at(mapping, held[v])
            for e in folded[r] if r in widths else ():
                if e.dst in again[k]:
                    src_map, dst_map = reduction.root_of(e.src)[1], reduction.root_of(e.dst)[1]
                    time += e.cost[at(src_map, e.src_group), at(dst_map, e.dst_group)]
            parts.append((time, mem))
        if r in widths:
            compute[r] = pool.interned(np.concatenate([t for t, _ in parts]))
        if r in widths or parts[0][1].any():
            memory[r] = pool.interned(np.concatenate([m for _, m in parts]))
    edges, joined = _edges(reduced.edges, original_dst, layers, again, count)
    edges += _links(layers, widths, joined, count)
    return ModeChoice(
        replace(
            reduced,
            compute=compute,
            memory=memory,
            edges=edges,
            activations={},
            blocks={r: (layers[r], widths[r]) for r in layers},
        ),
        widths,
        layers,
        modes,
    )


def _edges(
    edges: tuple[EdgeCost, ...],
    original_dst: dict[int, str],
    layers: dict[str, str],
    again: list[set[str]],
    count: int,
) -> tuple[tuple[EdgeCost, ...], list[tuple[str, str]]]:
    """Each reduced edge over its ends' strategies per mode, and the pairs of roots it
    joins mode to mode (a block diagonal edge)."""
    memo = ByIdentity()  # twin edges hold the same arrays: each is repeated once

    def tiled(a: np.ndarray) -> np.ndarray:
        return memo.made("tiled", (a,), lambda: np.tile(a, count))

    def stacked(g: np.ndarray, width: int) -> np.ndarray:
        return memo.made(
            ("stacked", width), (g,), lambda: np.concatenate([g + k * width for k in range(count)])
        )

    def priced(
        c: np.ndarray, twice: tuple[bool, ...], diagonal: bool
    ) -> np.ndarray | BlockDiagonal:
        def make() -> np.ndarray | BlockDiagonal:
            doubled = memo.made("doubled", (c,), lambda: c * 2)
            blocks = tuple(doubled if t else c for t in twice)
            return BlockDiagonal(blocks) if diagonal else np.hstack(blocks)

        return memo.made(("priced", diagonal, twice), (c,), make)

    out: list[EdgeCost] = []
    joined: list[tuple[str, str]] = []
    for q, e in enumerate(edges):
        dst = original_dst.get(q)
        twice = tuple(dst in r for r in again)
        src_in, dst_in = e.src in layers, e.dst in layers
        if not src_in and not dst_in:
            out.append(e)
            continue
        changes: dict[str, object] = {}
        recomputed = dst_in and any(twice)
        diagonal = recomputed and src_in and layers[e.src] == layers[e.dst]
        rows, cols = e.cost.shape
        if src_in:
            if diagonal:
                changes |= _grouped(e, "src", stacked(e.src_group, rows), count, memo)
            else:
                changes["src_group"] = tiled(e.src_group)
        if dst_in:
            if recomputed:
                changes |= _grouped(e, "dst", stacked(e.dst_group, cols), count, memo)
                changes["cost"] = priced(np.asarray(e.cost), twice, diagonal)
            else:
                changes["dst_group"] = tiled(e.dst_group)
        if diagonal:
            joined.append((e.src, e.dst))
        if recomputed and e.net is not None:
            changes |= _moded_route(e, twice, diagonal, memo)
        out.append(replace(e, **changes))  # type: ignore[arg-type]
    return tuple(out), joined


def _grouped(
    e: EdgeCost, end: str, group: np.ndarray, count: int, memo: ByIdentity
) -> dict[str, object]:
    """One end's groups repeated per mode, with their placements."""
    placements = getattr(e, f"{end}_placements")
    changes: dict[str, object] = {f"{end}_group": group}
    if placements:
        changes[f"{end}_placements"] = memo.made(
            ("placements", count), (placements,), lambda: tuple(placements) * count
        )
    return changes


def _moded_route(
    e: EdgeCost,
    twice: tuple[bool, ...],
    diagonal: bool,
    memo: ByIdentity,
) -> dict[str, object]:
    """A route-priced edge into a recomputed node, still a flow (a few moves, not every
    pair): over a network of its states once per mode, each copy's prices doubled where
    that mode recomputes the node, and entry states that step free into any copy. Rows
    start in their mode's copy on a block diagonal edge, else at the entry states;
    columns end in their mode's copy."""
    assert isinstance(e.net, Routes) and not isinstance(e.net, ModeRoutes)
    assert e.row_state is not None and e.col_state is not None
    net = e.net
    moded = memo.made(
        ("routes", twice), (net,), lambda: ModeRoutes(net, tuple(2.0 if t else 1.0 for t in twice))
    )
    size, count = net.size, len(twice)

    def copies(states: np.ndarray) -> np.ndarray:  # the states in each mode's copy
        return memo.made(
            ("copies", size, count),
            (states,),
            lambda: np.concatenate([states + (k + 1) * size for k in range(count)]),
        )

    rows = copies(e.row_state) if diagonal else e.row_state
    return {"net": moded, "row_state": rows, "col_state": copies(e.col_state)}


def _links(
    layers: dict[str, str], widths: dict[str, int], joined: list[tuple[str, str]], count: int
) -> tuple[EdgeCost, ...]:
    """Zero-cost edges that take one layer's roots to one mode where no priced edge joins
    them: from the layer's first component to each other one."""
    component = components(layers, joined)
    heads: dict[str, list[str]] = defaultdict(list)
    seen: dict[str, set[str]] = defaultdict(set)
    for r in layers:  # reduced-table order: a layer's first root leads
        if component[r] not in seen[layers[r]]:
            seen[layers[r]].add(component[r])
            heads[layers[r]].append(r)
    same = np.where(np.eye(count, dtype=bool), 0.0, np.inf)
    out = []
    for roots in heads.values():
        for r in roots[1:]:
            out.append(
                EdgeCost(
                    src=roots[0],
                    src_out=0,
                    dst=r,
                    slot=LINK_SLOT,
                    src_group=np.repeat(np.arange(count), widths[roots[0]]),
                    dst_group=np.repeat(np.arange(count), widths[r]),
                    cost=same,
                )
            )
    return tuple(out)


def _forward(traced: TracedGraph) -> set[fx.Node]:
    return forward_part(traced.node(n) for n in traced.outputs)
