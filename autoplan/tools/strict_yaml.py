"""Strict YAML for run files: the small subset a run file needs, everything else refused.

Input: YAML text and where it came from. Output: plain Python values (``dict``,
``list``, ``str``, ``int``, finite ``float``, ``bool``, ``None``), or a
:class:`~autoplan.core.errors.RunFileError` naming the line and the fix.

Why strict: YAML 1.1 (PyYAML's dialect) reads ``no`` as false, ``1:30`` as 90,
``012`` as 10, ``1e3`` as a string and a repeated key as the last one; a run file
is a dozen keys, so each of these is far more likely a mistake than an intent.
Refused: duplicate and non-string keys, anchors, aliases and merge keys, tags that
build dates, sets, binary or ordered pairs, ``yes/no/on/off`` as booleans,
integers not written in decimal, infinite and NaN numbers, files over 1 MiB.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol

import yaml

from autoplan.core.errors import RunFileError

MAX_BYTES = 1 << 20
_DECIMAL_INT = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
# YAML 1.2 reads 1e3 as a float; YAML 1.1 needs a dot, so 1e3 would be the string "1e3".
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$")


class _Mark(Protocol):
    """A position in the text: PyYAML's mark, or libyaml's under the C loader."""

    line: int  # from 0


class _Refused(yaml.YAMLError):
    """A construct strict YAML does not accept, with the node's position."""

    def __init__(self, message: str, mark: _Mark | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = None if mark is None else mark.line + 1


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the refusals the module docstring lists."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"alias *{event.anchor} is not accepted; write the value out", event.start_mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(
                f"anchor &{anchor} is not accepted; write each value where it is used",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(
                    "merge key << is not accepted; write the keys out", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise _Refused(
                    f"key {key!r} is not a name; quote it",
                    key_node.start_mark,
                )
            if key in seen:
                raise _Refused(
                    f"key {key!r} appears twice in one mapping; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_bool(self, node: Any) -> bool:
        text = self.construct_scalar(node)
        if text not in _BOOLS:
            raise _Refused(
                f"{text!r} would be read as a boolean; write true or false, or quote it as text",
                node.start_mark,
            )
        return _BOOLS[text]

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node))
        if not _DECIMAL_INT.match(text):
            raise _Refused(
                f"{text!r} would be read as a non-decimal integer; write it in decimal "
                "(no leading 0, 0x, 0b or colons), or quote it as text",
                node.start_mark,
            )
        return int(text)

    def construct_yaml_float(self, node: Any) -> float:
        text = str(self.construct_scalar(node))
        if ":" in text:
            raise _Refused(
                f"{text!r} would be read as a base-60 number; write it in decimal",
                node.start_mark,
            )
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"{text!r} is not a finite number; give a finite value", node.start_mark)
        return value

    def construct_yaml_timestamp(self, node: Any) -> Any:
        raise _Refused(f"{node.value!r} would be read as a date; quote it as text", node.start_mark)

    def construct_undefined(self, node: Any) -> Any:
        raise _Refused(
            f"tag {node.tag} is not accepted; a run file holds names, numbers, booleans, lists "
            "and mappings only",
            node.start_mark,
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _StrictLoader.construct_yaml_bool)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
for _tag in ("binary", "omap", "pairs", "set"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader.construct_undefined)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader.construct_yaml_timestamp)
_StrictLoader.add_constructor(None, _StrictLoader.construct_undefined)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789")
)


def load(text: str, source: str) -> Any:
    """Parse ``text`` (from ``source``, a path or ``--set k=v``) as strict YAML."""
    if len(text.encode()) > MAX_BYTES:
        raise RunFileError(
            f"{source}: {len(text.encode()):,} bytes is larger than a run file needs "
            f"(at most {MAX_BYTES:,}); is this the right file?"
        )
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _Refused as exc:
        where = f", line {exc.line}" if exc.line is not None else ""
        raise RunFileError(f"{source}{where}: {exc.message}") from exc
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).replace('in "<unicode string>", ', "").split())
        raise RunFileError(
            f"{source}: not valid YAML ({detail}); close every bracket and quote, "
            "or quote the whole value"
        ) from exc
