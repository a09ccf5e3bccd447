"""A run file's sections as dataclasses, read by the codec's walk in its YAML dialect.

Input: the run file's data (strict YAML, :mod:`autoplan.tools.strict_yaml`) and a section
name. Output: the section as a frozen record (:class:`MeshSection`, :class:`InputsSection`,
:class:`ConstraintsSection`, :class:`ModelSection`, or :class:`~autoplan.core.config.PlanConfig` for ``plan:``),
or a :class:`~autoplan.core.errors.RunFileError` naming the file, the key path
(``plan.memory_budget_gib``), the value, what is wrong and what is allowed.

Why: unknown keys, wrong types, out-of-range values and unknown choices are refused by
the same walk that reads a saved plan (:mod:`autoplan.core.codec`), from the same type
hints that check a PlanConfig built in Python; only rules that span keys (one axis name
per axis, placements per mesh axis, the model's longest sequence) stay in
:mod:`autoplan.tools.runfile`. YAML's own traps (repeated keys, ``no`` as false) are
refused before, while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, NewType, TypeVar

from autoplan.core.codec import Codec, Leaf, Limits, OneOf
from autoplan.core.codec_forms import YAML
from autoplan.core.errors import RunFileError
from autoplan.core.json_errors import DecodeError, describe
from autoplan.core.topology import Topology
from autoplan.models import hf
from autoplan.models.registry import REFERENCE

T = TypeVar("T")
Count = Annotated[int, Limits(least=1)]
Spec = NewType("Spec", str)
"""A placement as written (``"S(0)R"``); parsed against the mesh's axes once the mesh is read."""


@dataclass(frozen=True)
class ModelSection:
    """``model: {name: llama3, args: {...}}`` (a reference model, ``llama3`` when no name
    is given) or ``model: {hf: llama, config: {...}}`` (a Hugging Face model). Each kind's
    argument names and values are checked by its entry in :mod:`autoplan.models.registry`."""

    NOUN = "model"
    name: Annotated[str, OneOf(tuple(REFERENCE), "or model.hf for a Hugging Face model")] | None = (
        None
    )
    args: dict[str, Any] | None = field(default=None, metadata={"example": "{n_layers: 2}"})
    hf: Annotated[str, OneOf(tuple(hf.KINDS))] | None = None
    config: dict[str, Any] | None = field(
        default=None, metadata={"example": "{num_hidden_layers: 2}"}
    )


@dataclass(frozen=True)
class MeshSection:
    """``mesh: {shape: [8, 8], names: [dp, tp]}``: the axis sizes and one name per axis."""

    NOUN = "mesh"
    shape: tuple[Count, ...] = field(metadata={"example": "[8, 8]"})
    names: tuple[str, ...] = field(metadata={"example": "[dp, tp]"})


@dataclass(frozen=True)
class InputsSection:
    """``inputs: {batch: 8, seq: 32, placements: ["S(0)R"]}``: the global example batch
    (``seq`` tokens per sample) and, optionally, one placement per model input."""

    NOUN = "inputs"
    batch: Count = 8
    seq: Count = 32
    placements: tuple[Spec, ...] | None = field(default=None, metadata={"example": '["S(0)R"]'})


@dataclass(frozen=True)
class ConstraintsSection:
    """``constraints: {output_placements: [RR], pin: {output.weight: "RS(0)"}}``: the
    loss's placement and placements pinned per parameter FQN or graph node name."""

    NOUN = "constraints"
    output_placements: tuple[Spec, ...] | None = field(default=None, metadata={"example": "[RR]"})
    pin: dict[str, Spec] | None = field(
        default=None, metadata={"example": '{output.weight: "RS(0)"}'}
    )


def _not_here(value: Any) -> Any:
    raise ValueError(value)


def _spec(value: Any) -> Spec:
    if not isinstance(value, str):
        raise ValueError(value)
    return Spec(value)


_CODEC = Codec(
    {
        Spec: Leaf(
            str,
            _spec,
            'give a placement such as "S(0)R" (one entry per mesh axis)',
            "is not a placement string",
        ),  # fmt: skip
        Topology: Leaf(
            str,
            _not_here,
            "move it to the top level, e.g. topology: h100",
            "is a section of its own, not a plan key",
        ),
    },
    YAML,
)
"""The run file's codec: the sections' hints, worded for a YAML file."""


def read_section(raw: dict[str, Any], name: str, cls: type[T], source: str) -> T:
    """Section ``name`` of the run file ``source`` (left out or empty: every default) read
    as ``cls``; a RunFileError at the first key that is not valid."""
    data = raw.get(name)
    try:
        value: T = _CODEC.decode({} if data is None else data, cls, (name,))
    except DecodeError as exc:
        raise RunFileError(
            f"{source}: {describe(exc.path, exc.value)} {exc.problem}; {exc.valid}"
        ) from None
    return value
