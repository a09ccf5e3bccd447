"""The typed parts of a plan and the one codec of its file.

Input: what the planner reads out (placements, moves, buckets, priced collectives).
Output: frozen records :class:`~autoplan.result.plan.Plan` holds, and :data:`CODEC`, which
writes them as the plan file's JSON and reads that JSON back through the same types
(:mod:`autoplan.core.codec`): placements in DTensor's short form (``S(0)R``; ``-`` for an
output or input that is no tensor), a route keyed ``"node:slot"``.

Why its own module: the records are the file's schema. Each is also readable by the keys
of its JSON object (``plan.node_placements["mm"]["out"] == ["S(0)R"]``), as scripts
written against the plan file read it, while code reads the typed fields (``.out``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, NamedTuple, get_type_hints

from autoplan.core.codec import Codec, Leaf, Limits, OneOf
from autoplan.core.placements import ALLOWED, Placements, fmt, parse, same

STATUSES = ("optimal", "time_limit", "node_limit", "infeasible")
# The categories of Plan.memory_breakdown, the one list of them: (key, label in a plan's
# summary, label in compare's table). A new category is one line here.
MEMORY_CATEGORIES = (
    ("parameters", "params", "parameters"),
    ("gradients", "grads", "gradients"),
    ("optimizer", "optimizer", "optimizer state"),
    ("activations", "saved activations", "saved activations"),
    ("output_grad", "output's gradient", "output's gradient"),
    ("transient", "backward transient", "backward transient"),
)
BREAKDOWN_KEYS = tuple(key for key, _, _ in MEMORY_CATEGORIES)

Signed = Annotated[float, Limits(least=None)]
"""A number of any sign (a statistic, a bound)."""
Cost = Annotated[float, Limits(finite=False)]
"""Microseconds a plan costs: NaN for the infeasible plan, which has none."""
Size = Annotated[int, Limits(least=1)]
"""A mesh axis's size."""
SharedKind = tuple[Annotated[str, OneOf(("head", "tail"))], str, tuple[int, ...]]
"""A bucket kind: where its bucket runs (``head`` or ``tail``), its collective, its mesh axes."""
Slotted = Placements | None
"""The placements of one output or input of a node; None where it is no tensor."""


class Slot(NamedTuple):
    """A node's tensor input: the node and the input's position (``"mm:0"`` in the file)."""

    node: str
    slot: int

    def __str__(self) -> str:
        return f"{self.node}:{self.slot}"


class FileView:
    """A record read by the keys of its JSON object gives their JSON values."""

    def __getitem__(self, key: str) -> Any:
        found = _names(type(self)).get(key)
        if found is None:
            raise KeyError(key)
        name, hint = found
        return CODEC.encode(getattr(self, name), hint)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in _names(type(self)) else default


def _names(cls: type) -> dict[str, tuple[str, Any]]:
    """JSON key -> (field name, type hint) of a record class."""
    found = _KEYS.get(cls)
    if found is None:
        found = _KEYS[cls] = _keys(cls)
    return found


_KEYS: dict[type, dict[str, tuple[str, Any]]] = {}  # per record class, read off its fields


def _keys(cls: type) -> dict[str, tuple[str, Any]]:
    hints = get_type_hints(cls)
    return {f.metadata.get("key", f.name): (f.name, hints[f.name]) for f in dataclasses.fields(cls)}


@dataclass(frozen=True, eq=False)
class NodePlacement(FileView):
    """One graph node's chosen strategy: its op (``aten.mm.default``, ``placeholder``),
    the placements of its outputs and those each tensor input is moved to."""

    NOUN = "node placement"

    op: str
    out: tuple[Slotted, ...]
    inputs: tuple[Slotted, ...] = field(metadata={"key": "in"})

    def __eq__(self, other: object) -> bool:
        # a masked partial equals another only by its short form (DTensor compares the
        # per-tensor mask buffer by identity), so a plan read back equals the one saved
        if not isinstance(other, NodePlacement):
            return NotImplemented
        return (
            self.op == other.op
            and len(self.out) == len(other.out)
            and len(self.inputs) == len(other.inputs)
            and all(map(same, self.out + self.inputs, other.out + other.inputs))
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class CommTotal(FileView):
    """The collectives of one kind a step runs, as priced: how many, bytes, microseconds."""

    NOUN = "comm entry"

    count: int
    bytes: float
    us: float


@dataclass(frozen=True)
class Bucket(FileView):
    """Collectives of one kind run merged (:mod:`autoplan.cost.buckets`): at the step's
    ``head`` (parameter gathers) or ``tail`` (gradient reductions), over the mesh ``axes``,
    ``members`` moves of ``bytes`` in all, priced ``us`` merged and ``us_alone`` as the
    objective charged them (apart, or each a share of a launch: ``Plan.shared_launches``)."""

    NOUN = "bucket"

    kind: str
    where: Annotated[str, OneOf(("head", "tail"))]
    axes: tuple[int, ...]
    members: Annotated[int, Limits(least=1)]
    bytes: float
    us: float
    us_alone: float


def _read_placements(text: Any) -> Placements:
    if not isinstance(text, str):
        raise ValueError(text)
    if "MaskP" in text:  # a masked partial holds a per-tensor mask buffer: never shared
        return parse(text)
    return _parse_shared(text)


@lru_cache(maxsize=1024)
def _parse_shared(text: str) -> Placements:
    """:func:`~autoplan.core.placements.parse` of placements that are frozen values (a plan
    repeats a few dozen strings thousands of times)."""
    return parse(text)


def _read_slotted(text: Any) -> Slotted:
    return None if text == "-" else _read_placements(text)


def _read_slot(text: Any) -> Slot:
    node, colon, slot = text.rpartition(":")
    if not colon or not node or not slot.isdigit():
        raise ValueError(text)
    return Slot(node, int(slot))


_PARSE = "does not parse as placements"
_VALID = f"give one of {ALLOWED} per mesh axis"
CODEC = Codec(
    {
        Placements: Leaf(fmt, _read_placements, _VALID, _PARSE),
        Slotted: Leaf(fmt, _read_slotted, _VALID + ", or - for no tensor", _PARSE),
        Slot: Leaf(str, _read_slot, 'key a route "node:slot", e.g. "mm:0"', "is not node:slot"),
    }
)
"""The plan file's codec: each record written and read through its type hints."""
