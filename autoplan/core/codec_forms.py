"""The codec's vocabulary: the annotations a hint carries and the dialects messages use.

Input: nothing (types and constants). Output: :class:`Limits` and :class:`OneOf` (what
``Annotated`` adds to a hint), :class:`Leaf` (a type the caller reads and writes itself)
and :class:`Dialect` with its three instances: :data:`JSON` (a plan file,
``node_placements["mm"]``), :data:`YAML` (a run file, ``plan.memory_budget_gib``) and
:data:`PYTHON` (keyword arguments, ``memory_budget_gib``).

Why apart from :mod:`autoplan.core.codec`: the dataclasses that describe a file import
these to annotate their fields, and the walk stays one concern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from autoplan.core.json_errors import DecodeError, Path, key_path


@dataclass(frozen=True)
class Limits:
    """Bounds of a number: ``Annotated[int, Limits(least=1)]``. ``least`` None: any sign;
    ``above``/``below``: strict bounds (``Limits(above=0)``: positive); ``finite=False``:
    NaN and the infinities are values (written ``null``, read as NaN)."""

    least: float | None = 0
    finite: bool = True
    above: float | None = None
    below: float | None = None

    def text(self) -> str:
        """The bounds as `` >= 0``, `` > 0 and < 1``, or ``""`` for none."""
        parts = [f"{op} {b:g}" for op, b in ((">", self.above), ("<", self.below)) if b is not None]
        if self.least is not None and self.above is None:
            parts.insert(0, f">= {self.least:g}")
        return "".join(f" {p}" if i == 0 else f" and {p}" for i, p in enumerate(parts))


@dataclass(frozen=True)
class Dialect:
    """How messages name a key path and the document's forms: JSON by default."""

    name_path: Callable[[Path], str] = key_path
    mapping: str = "a JSON object"
    array: str = "a JSON array"
    null: str = "null"
    booleans: str = "true or false"
    missing: str = "every {noun} records it"
    restore: str = "restore it"
    list_keys: bool = False  # an unknown key's fix lists the record's keys

    def fail(self, path: Path, value: Any, problem: str, valid: str) -> NoReturn:
        """Raise the DecodeError of ``value`` at ``path``."""
        raise DecodeError(self.name_path(path), value, problem, valid)


JSON = Dialect()


@dataclass(frozen=True)
class OneOf:
    """The values a string may take: ``Annotated[str, OneOf(("head", "tail"))]`` (rather
    than a ``Literal``: the choices are often a constant kept elsewhere). ``also`` ends
    the fix with another way out (``"or model.hf for a Hugging Face model"``)."""

    choices: tuple[str, ...]
    also: str = ""


@dataclass(frozen=True)
class Leaf:
    """A type the caller writes as JSON (``write``) and reads back (``read``, raising
    ``ValueError`` on a bad value, which then ``problem``); ``valid`` tells what a valid
    value looks like."""

    write: Callable[[Any], Any]
    read: Callable[[Any], Any]
    valid: str
    problem: str = "is not valid"


def dotted(path: Path) -> str:
    """``("plan", "memory_budget_gib")`` -> ``plan.memory_budget_gib``, ``("mesh", "shape",
    0)`` -> ``mesh.shape[0]``: a YAML file's keys as a person writes them."""
    return "".join(
        f"[{k}]" if isinstance(k, int) else (f".{k}" if i else str(k)) for i, k in enumerate(path)
    )


YAML = Dialect(
    name_path=dotted,
    mapping="a mapping",
    array="a list",
    missing="a {noun} section needs it",
    restore="add it",
    list_keys=True,
)
PYTHON = Dialect(
    name_path=dotted,
    mapping="a dict",
    array="a list or tuple",
    null="None",
    booleans="True or False",
    missing="{noun} needs it",
    restore="pass it",
    list_keys=True,
)
