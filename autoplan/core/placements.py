"""Placement helpers shared by every stage: the short form, local shapes.

A *placements* value is a tuple with one DTensor placement per mesh axis, e.g.
``(Shard(0), Replicate())``, printed ``S(0)R``. :func:`fmt` and :func:`parse` are the
one grammar of that form, exact inverses on every placement the planner makes: plan
files, run files, pins and messages all use it, so what one tool writes the others read
back as the same placements. ``_StridedShard`` counts as sharded everywhere autoplan asks
"is this dim sharded" (local shapes, FLOPs, memory, redistribution): :func:`sharded_dim`
is the one helper for that question.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import TypeGuard

from autoplan.core.errors import PlanError
from autoplan.core.torch_adapter import (
    Partial,
    Placement,
    Replicate,
    Shard,
    _StridedShard,
    is_masked_partial,
    masked_partial,
)

Placements = tuple[Placement, ...]


# Whether each placement class shards, and whether it is strided, by exact type. torch
# 2.13's placement classes have a metaclass whose isinstance check runs in Python, and the
# strategies and cost stages ask for every placement they meet.
_SHARDS: dict[type, tuple[bool, bool]] = {}


def _shards(p: Placement) -> tuple[bool, bool]:
    """(shards a dim, is a _StridedShard) for ``p``'s class."""
    t = type(p)
    found = _SHARDS.get(t)
    if found is None:
        found = _SHARDS[t] = (issubclass(t, (Shard, _StridedShard)), issubclass(t, _StridedShard))
    return found


def _is_shard(p: Placement) -> TypeGuard[Shard | _StridedShard]:
    return _shards(p)[0]


def sharded_dim(p: Placement) -> int | None:
    """The tensor dim ``p`` shards (plain or strided), or None for R and P."""
    return p.dim if _is_shard(p) else None


def is_strided(p: Placement) -> TypeGuard[_StridedShard]:
    """Whether ``p`` is a ``_StridedShard``."""
    return _shards(p)[1]


def plain(placements: Placements) -> Placements:
    """``placements`` with each ``_StridedShard(d, split_factor=1)`` written ``Shard(d)``.

    A split factor of 1 interleaves nothing: every rank holds the same shard as under
    ``Shard(d)``, uneven sizes included. DTensor's views make it (flattening a batch
    sharded down to one row per rank with the sequence sharded after it), and the mm
    rules then offer every strategy twice, once per spelling. autoplan treats the two
    spellings as one layout: priced as one, moved between by relabelling the local
    shard, no collective (:mod:`autoplan.runtime.execute`).
    """
    if not any(is_strided(p) and p.split_factor == 1 for p in placements):
        return placements
    return tuple(Shard(p.dim) if is_strided(p) and p.split_factor == 1 else p for p in placements)


# The reductions a partial placement may pend: DTensor's Partial.ALL_REDUCE_OPS and the
# bitwise ones its docstring lists for integer tensors.
REDUCE_OPS: tuple[str, ...] = (*Partial.ALL_REDUCE_OPS, "band", "bor", "bxor")

ALLOWED = (
    "S(d), _S(d,split_factor), R, P (a pending sum), "
    f"P(op) with op one of {', '.join(op for op in REDUCE_OPS if op != 'sum')}"
)


def short(p: Placement | None) -> str:
    """DTensor's short form, the one spelling :func:`parse` reads back: ``S(0)``,
    ``_S(0,2)``, ``R``, ``P`` (a sum), ``P(avg)`` (another reduction) and
    ``MaskP(sum,[128,64],0)`` (the vocab-parallel embedding's masked partial: its reduction,
    the embedding table's shape and the dim it is split on); ``-`` for no tensor."""
    if p is None:
        return "-"
    if isinstance(p, _StridedShard):
        return f"_S({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if is_masked_partial(p):
        shape = "None" if p.offset_shape is None else f"[{','.join(map(str, p.offset_shape))}]"
        return f"MaskP({p.reduce_op},{shape},{p.offset_dim})"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    return str(p)


def made_by_op_only(placements: Sequence[Placement]) -> bool:
    """Whether ``placements`` pend a reduction no move can make: a partial other than a sum
    (``P(avg)``: a mean over a sharded dim) or a masked partial (the vocab-parallel
    embedding's). Only the op computing the tensor makes it; moves lead away from it."""
    return any(
        is_masked_partial(p) or (isinstance(p, Partial) and p.reduce_op != "sum")
        for p in placements
    )


def same(a: Sequence[Placement] | None, b: Sequence[Placement] | None) -> bool:
    """Whether ``a`` and ``b`` are the same placements, a masked partial compared by what
    :func:`short` prints (DTensor compares its per-tensor mask buffer by identity, so a
    parsed one never equals the planner's)."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x == y or (is_masked_partial(x) and is_masked_partial(y) and short(x) == short(y))
        for x, y in zip(a, b, strict=True)
    )


def fmt(placements: Sequence[Placement] | None) -> str:
    """``(Shard(0), Replicate())`` -> ``S(0)R``; :func:`parse` is its inverse."""
    if placements is None:
        return "-"
    return "".join(short(p) for p in placements)


_TOKEN = re.compile(
    r"[\s,]*(?:"
    r"_S\(\s*(?P<strided_dim>\d+)\s*,\s*(?P<split_factor>\d+)\s*\)"
    r"|S\(\s*(?P<shard_dim>\d+)\s*\)"
    r"|(?P<replicate>R)"
    r"|MaskP\(\s*(?P<masked_op>\w+)\s*,\s*(?P<offset_shape>None|\[[\d\s,]*\])\s*,"
    r"\s*(?P<offset_dim>\d+)\s*\)"
    r"|P\(\s*(?P<partial_op>\w*)\s*\)"
    r"|(?P<sum>P)"
    r")[\s,]*"
)


def parse(text: str, num_axes: int | None = None) -> Placements:
    """Parse the short form (:func:`fmt`): ``"S(0)R"``, ``"S(0), R"``, ``"_S(0,2)P(avg)"``.

    Spaces and commas may separate the axes. A sum partial has one spelling, ``P``: every
    placement has one text, so a plan written and read back is the same file. Raises
    :class:`~autoplan.core.errors.PlanError` (a ValueError) naming the text and the allowed forms.
    """
    pos, out = 0, []
    while pos < len(text) and text[pos:].strip(" ,\t\n") != "":
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PlanError(
                f"placement {text!r} does not parse at {text[pos:]!r}; allowed per mesh axis: "
                f"{ALLOWED}"
            )
        out.append(_placement(m, text))
        pos = m.end()
    if not out:
        raise PlanError(f"placement {text!r} is empty; write one of {ALLOWED} per mesh axis")
    if num_axes is not None and len(out) != num_axes:
        raise PlanError(
            f"placement {text!r} has {len(out)} entries but the mesh has {num_axes} axes; "
            "give one placement per mesh axis"
        )
    return tuple(out)


def _placement(m: re.Match[str], text: str) -> Placement:
    """The placement one matched token of :data:`_TOKEN` spells."""
    if m["strided_dim"] is not None:
        return _StridedShard(int(m["strided_dim"]), split_factor=int(m["split_factor"]))
    if m["shard_dim"] is not None:
        return Shard(int(m["shard_dim"]))
    if m["replicate"]:
        return Replicate()
    if m["sum"]:
        return Partial()
    op = m["partial_op"] if m["masked_op"] is None else m["masked_op"]
    if op == "sum" and m["masked_op"] is None:
        raise PlanError(f"placement {text!r}: a pending sum is written P, not P(sum); write P")
    if op not in REDUCE_OPS:
        raise PlanError(
            f"placement {text!r}: {op!r} is not a reduction a partial can pend; allowed per "
            f"mesh axis: {ALLOWED}"
        )
    if m["masked_op"] is None:
        return Partial(op)
    dims = m["offset_shape"]
    shape = None if dims == "None" else [int(d) for d in re.findall(r"\d+", dims)]
    return masked_partial(op, shape, int(m["offset_dim"]))


def shard_degrees(
    placements: Sequence[Placement], mesh_shape: Sequence[int], ndim: int
) -> list[int]:
    """How many ways each tensor dim is split under ``placements``."""
    degrees = [1] * ndim
    for p, size in zip(placements, mesh_shape, strict=True):
        d = sharded_dim(p)
        if d is not None:
            degrees[d] *= size
    return degrees


def local_shape(
    shape: Sequence[int], placements: Sequence[Placement], mesh_shape: Sequence[int]
) -> tuple[int, ...]:
    """Per-rank shape (even sharding assumed; see :func:`is_even`)."""
    # divided axis after axis: for positive ints (s // a) // b == s // (a * b)
    out = list(shape)
    for p, size in zip(placements, mesh_shape, strict=True):
        if _shards(p)[0]:
            out[p.dim] //= size  # type: ignore[attr-defined]
    return tuple(out)


def is_even(
    shape: Sequence[int], placements: Sequence[Placement], mesh_shape: Sequence[int]
) -> bool:
    """True iff every sharded dim divides evenly, axis after axis.

    Each axis splits what the earlier axes left of the dim; a
    ``_StridedShard(d, sf)`` needs that remainder to divide by ``sf`` times
    the axis size.
    """
    remaining = list(shape)
    for p, size in zip(placements, mesh_shape, strict=True):
        shards, strided = _shards(p)  # once per placement, not per question
        if not shards:
            continue
        d = p.dim  # type: ignore[attr-defined]
        if d >= len(shape):
            return False
        step = size * int(p.split_factor) if strided else size  # type: ignore[attr-defined]
        if remaining[d] % step != 0:
            return False
        remaining[d] //= size
    return True


def even_placements(shape: Sequence[int], mesh_shape: Sequence[int]) -> list[Placements]:
    """Every placement tuple of R and S(d) (dims longer than 1) that splits ``shape``
    evenly: the candidates of a graph input, parameter or buffer."""
    per_axis = [Replicate()] + [Shard(d) for d, s in enumerate(shape) if s > 1]
    return [
        combo
        for combo in itertools.product(per_axis, repeat=len(mesh_shape))
        if is_even(shape, combo, mesh_shape)
    ]


def local_fraction(placements: Sequence[Placement], mesh_shape: Sequence[int]) -> float:
    """Fraction of the global tensor each rank holds (1.0 when not sharded)."""
    k = 1
    for p, size in zip(placements, mesh_shape, strict=True):
        if sharded_dim(p) is not None:
            k *= size
    return 1.0 / k


def num_elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


def cotangent_placements(placements: Placements) -> Placements:
    """Where the cotangent of an output placed ``placements`` arrives: the same shards,
    and replicated where the output is a partial sum (its every term has that gradient)."""
    if not any(p.is_partial() for p in placements):
        return placements
    return tuple(Replicate() if p.is_partial() else p for p in placements)
