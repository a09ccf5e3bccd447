"""Placement helpers shared by every stage: short printing, parsing, local shapes.

A *placements* value is a tuple with one DTensor placement per mesh axis, e.g.
``(Shard(0), Replicate())``, printed ``S(0)R``. ``_StridedShard`` counts as
sharded everywhere autoplan asks "is this dim sharded" (local shapes, FLOPs,
memory, redistribution): :func:`sharded_dim` is the one helper for that
question.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

from autoplan.errors import PlanError
from autoplan.strategies.dtensor import Partial, Placement, Replicate, Shard, _StridedShard

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


def sharded_dim(p: Placement) -> int | None:
    """The tensor dim ``p`` shards (plain or strided), or None for R and P."""
    return p.dim if _shards(p)[0] else None


def is_strided(p: Placement) -> bool:
    """Whether ``p`` is a ``_StridedShard``."""
    return _shards(p)[1]


def plain(placements: Placements) -> Placements:
    """``placements`` with each ``_StridedShard(d, split_factor=1)`` written ``Shard(d)``.

    A split factor of 1 interleaves nothing: every rank holds the same shard as under
    ``Shard(d)``, uneven sizes included. DTensor's views make it (flattening a batch
    sharded down to one row per rank with the sequence sharded after it), and the mm
    rules then offer every strategy twice, once per spelling. autoplan treats the two
    spellings as one layout: priced as one, moved between by relabelling the local
    shard, no collective (:mod:`autoplan.execute`).
    """
    if not any(_shards(p)[1] and p.split_factor == 1 for p in placements):
        return placements
    return tuple(Shard(p.dim) if _shards(p)[1] and p.split_factor == 1 else p for p in placements)


def short(p: Placement | None) -> str:
    """DTensor's short form: ``S(0)``, ``_S(0,2)``, ``R``, ``P``."""
    if p is None:
        return "-"
    if isinstance(p, _StridedShard):
        return f"_S({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" and type(p) is Partial else f"P({p.reduce_op})"
    return str(p)


def fmt(placements: Sequence[Placement] | None) -> str:
    """``(Shard(0), Replicate())`` -> ``S(0)R``."""
    if placements is None:
        return "-"
    return "".join(short(p) for p in placements)


_TOKEN = re.compile(r"[\s,]*(_S\(\s*(\d+)\s*,\s*(\d+)\s*\)|S\(\s*(\d+)\s*\)|R|P)[\s,]*")


def parse(text: str, num_axes: int | None = None) -> Placements:
    """Parse ``"S(0)R"``, ``"S(0), R"`` or ``"_S(0,2)P"`` into placements.

    Raises ValueError naming the text and the allowed forms.
    """
    pos, out = 0, []
    cleaned = text
    while pos < len(cleaned):
        if cleaned[pos:].strip(" ,\t") == "":
            break
        m = _TOKEN.match(cleaned, pos)
        if m is None:
            raise PlanError(
                f"placement {text!r} does not parse at {cleaned[pos:]!r}; "
                "allowed per mesh axis: S(d), _S(d,split_factor), R, P"
            )
        tok = m.group(1)
        if tok.startswith("_S"):
            out.append(_StridedShard(int(m.group(2)), split_factor=int(m.group(3))))
        elif tok.startswith("S"):
            out.append(Shard(int(m.group(4))))
        elif tok == "R":
            out.append(Replicate())
        else:
            out.append(Partial())
        pos = m.end()
    if not out:
        raise PlanError(f"placement {text!r} is empty; write one of S(d), R, P per mesh axis")
    if num_axes is not None and len(out) != num_axes:
        raise PlanError(
            f"placement {text!r} has {len(out)} entries but the mesh has {num_axes} axes; "
            "give one placement per mesh axis"
        )
    return tuple(out)


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
    degrees = shard_degrees(placements, mesh_shape, len(shape))
    return tuple(s // k for s, k in zip(shape, degrees, strict=True))


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
        d = sharded_dim(p)
        if d is None:
            continue
        if d >= len(shape):
            return False
        step = size * p.split_factor if is_strided(p) else size
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
