"""JSON documents read with errors that name where: the key path, the value, what is wrong.

Input: JSON text (:func:`read_json`), or a key path and a value a reader refuses
(:func:`fail`). Output: the JSON data, or a :class:`DecodeError` whose parts a caller
words into its own message (``PLAN.json: mesh_shape[1] = 0 is not an integer >= 1. Fix:
...``).

Why its own module: the codec (:mod:`autoplan.core.codec`) and the checks that span
fields of a decoded file (:mod:`autoplan.result.plan_check`) fail in one vocabulary.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

Path = tuple[str | int, ...]  # the keys from the document's root to a value
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "<absent>"})()


class DecodeError(ValueError):
    """``value`` at ``path`` (None: the whole document) ``problem``; ``valid`` says what a
    valid value looks like. ``value`` is :data:`ABSENT` for a missing key."""

    def __init__(self, path: str | None, value: Any, problem: str, valid: str) -> None:
        self.path, self.value, self.problem, self.valid = path, value, problem, valid
        super().__init__(f"{describe(path, value)} {problem}; {valid}")


def describe(path: str | None, value: Any) -> str:
    """``key = value``, ``key is missing:`` or ``the file``: the start of a message."""
    if path is None:
        return "the file"
    return f"{path} is missing:" if value is ABSENT else f"{path} = {show(value)}"


def show(value: Any) -> str:
    """``value`` as JSON, cut to 80 characters."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def key_path(path: Path) -> str:
    """``("a", "b", 0)`` -> ``a["b"][0]``: a name at the root, then JSON keys or positions."""
    if not path:
        return "the document"
    head, *rest = path
    return str(head) + "".join(f"[{json.dumps(k) if isinstance(k, str) else k}]" for k in rest)


def read_json(text: str) -> Any:
    """The JSON in ``text``, each object without a repeated key; a DecodeError about the
    whole document if it is empty, not JSON or nested too deeply."""
    valid = "restore the file as it was written"
    if not text.strip():
        raise DecodeError(None, None, "is empty", valid)

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            keys = [k for k, _ in pairs]
            twice = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise DecodeError(
                None, None, f"repeats the key {json.dumps(twice)} in one object", valid
            )
        return obj

    try:
        return json.loads(text, object_pairs_hook=no_repeats)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg}: line {exc.lineno} column {exc.colno}"
        raise DecodeError(
            None, None, f"is not valid JSON ({where}): truncated or mistyped", valid
        ) from None
    except RecursionError:
        raise DecodeError(None, None, "is JSON nested too deeply", valid) from None


def fail(path: Path, value: Any, problem: str, valid: str) -> NoReturn:
    """Raise the DecodeError of ``value`` at ``path``."""
    raise DecodeError(key_path(path), value, problem, valid)
