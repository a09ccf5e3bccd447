"""Stage 3, strategies: single-dim rules expanded over a mesh, and kept only where even.

Input: DTensor's single-dim rules of one op (one placement per tensor, per mesh axis
alike), the split factors seen on its inputs and the mesh shape. Output: the op's
strategies on the whole mesh (the product of the rules over the axes), those that shard
every tensor evenly, with masked partials made one object each.

Why its own module: the expansion and the evenness filter are pure functions of rules and
shapes; the enumerator (:mod:`autoplan.strategies.enumerate`) walks the graph and caches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from autoplan.core.placements import Placements, is_even
from autoplan.core.torch_adapter import (
    Partial,
    Placement,
    Replicate,
    fill_placeholders,
    is_masked_partial,
    masked_partial_key,
)
from autoplan.strategies.table import Strategy, TensorInfo


def keep_placement(p: Placement | None) -> bool:
    """Partial only as a sum: other reductions multiply the candidates without helping a step."""
    return not isinstance(p, Partial) or p.reduce_op == "sum"


def expand(
    rules: list[list[Any]],
    seen: frozenset[Placement],
    num_outs: int,
    width: int,
    mesh_shape: Sequence[int],
) -> list[Strategy]:
    """The product over the mesh's axes of ``rules`` filled with the split factors ``seen``:
    one strategy per choice of a rule for every axis."""
    filled = [r for r in fill_placeholders(rules, set(seen)) if all(map(keep_placement, r))]
    filled = [r for r in filled if len(r) == width]
    out = []
    for combo in itertools.product(filled, repeat=len(mesh_shape)):
        per_tensor = list(zip(*combo, strict=True))
        outs = tuple(None if any(p is None for p in t) else tuple(t) for t in per_tensor[:num_outs])
        ins = tuple(tuple(t) for t in per_tensor[num_outs:])
        out.append(Strategy(outs=outs, ins=ins))
    return out


def even_only(
    strategies: Iterable[Strategy],
    in_infos: Sequence[TensorInfo | None],
    out_infos: Sequence[TensorInfo | None],
    mesh_shape: tuple[int, ...],
    masked: dict[tuple[Any, ...], Placement],
) -> list[Strategy]:
    """The strategies with one placement per input that shard every tensor evenly, made
    canonical (:func:`canonical`) with the run's ``masked`` partials."""
    kept = []
    for s in strategies:
        if len(s.ins) != len(in_infos):
            continue
        pairs = list(zip(s.outs, out_infos, strict=False)) + list(zip(s.ins, in_infos, strict=True))
        if all(p is None or i is None or is_even(i.shape, p, mesh_shape) for p, i in pairs):
            kept.append(canonical(s, masked))
    return kept


def canonical(s: Strategy, masked: dict[tuple[Any, ...], Placement]) -> Strategy:
    """``s`` with one object per distinct masked partial (kept in ``masked``), so placements
    compare by value: DTensor's ``_MaskPartial`` carries a per-instance mask buffer that
    takes part in equality, and two embeddings' partials would otherwise never match."""

    def canon(ps: Placements) -> Placements:
        for p in ps:  # a loop, not any() over a generator: it runs per placement tuple
            if is_masked_partial(p):
                break
        else:
            return ps
        return tuple(
            masked.setdefault(masked_partial_key(p), p) if is_masked_partial(p) else p for p in ps
        )

    outs = tuple(None if ps is None else canon(ps) for ps in s.outs)
    return Strategy(outs=outs, ins=tuple(map(canon, s.ins)))


def replicate_all(num_outs: int, num_ins: int, mesh_shape: Sequence[int]) -> Strategy:
    """Every tensor replicated on every axis: the strategy of an op with no rule."""
    rep = tuple(Replicate() for _ in mesh_shape)
    return Strategy(outs=(rep,) * num_outs, ins=(rep,) * num_ins)
