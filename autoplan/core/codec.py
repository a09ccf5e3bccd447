"""A JSON codec driven by type hints: one walk over a type both writes and reads a value.

Input: a type hint (a frozen dataclass, or any hint built of the forms below) and a value
of it (:meth:`Codec.encode`), or JSON data (:meth:`Codec.decode`). Output: JSON data, or
the typed value, or a DecodeError naming the key path (``node_placements["mm"]["out"][0]``),
the value, what is wrong with it and what is allowed.

Why: a file written by one function and read back by another drifts (a plan file once held
a route its loader refused). Here both directions follow the same hint, so every value
the writer can emit is one the reader accepts, and the dataclasses document the file.
A library (pydantic, msgspec, cattrs) would need custom hooks for the placements, our
own error wording and JSON's non-finite floats anyway; this walk is smaller than that glue.

Forms: a dataclass is an object keyed by its field names (``metadata={"key": ...}``
renames one, ``metadata={"example": ...}`` ends the fix of its value with an example);
a field with a default may be left out, an unknown key is refused (messages
call the record by its ``NOUN`` class attribute, else its class name).
``dict[K, V]`` is an object (K ``str``, a string with choices or a leaf written as a
string); ``list[X]``, ``tuple[X, ...]`` and ``tuple[X, Y]`` are arrays; ``X | None`` is
``null`` or X; ``int``, ``float`` (non-finite written ``null``), ``str``, ``bool``; ``Any``
passes through; ``Annotated[X, Limits(...)]`` bounds a number and
``Annotated[str, OneOf(...)]`` names a string's choices. A *leaf* (:class:`Leaf`) is a
type the caller writes and reads itself (``Placements`` as ``"S(0)R"``).

A :class:`~autoplan.core.codec_forms.Dialect` words the messages for the document read:
JSON (a plan file, the default), YAML (a run file) or Python keyword arguments
(:meth:`Codec.check` of a built dataclass). The walk, and so what is accepted, is the same.

Decoding reads JSON data (:func:`autoplan.core.json_errors.read_json`); its errors are
:class:`~autoplan.core.json_errors.DecodeError` s.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from autoplan.core.codec_forms import JSON, Dialect, Leaf, Limits, OneOf
from autoplan.core.json_errors import ABSENT, DecodeError, Path

__all__ = ["Codec", "Dialect", "Leaf", "Limits", "OneOf"]

Decoder = Callable[[Any, Path], Any]
Encoder = Callable[[Any], Any]


def _noun(cls: type) -> str:
    return str(getattr(cls, "NOUN", cls.__name__))


class Codec:
    """Writes and reads values by their type hints, with ``leaves`` (hint -> :class:`Leaf`)
    for the types it does not know. Decoders are built once per hint."""

    def __init__(self, leaves: Mapping[Any, Leaf] | None = None, dialect: Dialect = JSON) -> None:
        self.leaves = dict(leaves or {})
        self.dialect = dialect
        self._encoders: dict[Any, Encoder] = {}
        self._decoders: dict[Any, Decoder] = {}

    # -- writing ---------------------------------------------------------------------

    def encode(self, value: Any, hint: Any) -> Any:
        """``value`` (of type ``hint``) as JSON data."""
        return self._encoder(hint)(value)

    def _encoder(self, hint: Any) -> Encoder:
        found = self._encoders.get(hint)
        if found is None:
            found = self._encoders[hint] = self._build_encoder(hint)
        return found

    def _build_encoder(self, hint: Any) -> Encoder:
        leaf = self.leaves.get(hint)
        if leaf is not None:
            return leaf.write
        origin, args = get_origin(hint), get_args(hint)
        if origin is Annotated:
            return self._encoder(args[0])
        if dataclasses.is_dataclass(hint):
            fields = [
                (f.name, f.metadata.get("key", f.name), self._encoder(h)) for f, h in _fields(hint)
            ]
            return lambda value: {k: enc(getattr(value, name)) for name, k, enc in fields}
        if origin in (Union, types.UnionType):
            options = [(a, self._encoder(a)) for a in args if a is not type(None)]
            if len(options) == 1:
                one = options[0][1]
                return lambda value: None if value is None else one(value)
            return lambda value: (
                None if value is None else next(enc for a, enc in options if _is(value, a))(value)
            )
        if origin is dict:
            key, item = self._encoder(args[0]), self._encoder(args[1])
            return lambda value: {key(k): item(v) for k, v in value.items()}
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            items = [self._encoder(a) for a in args]
            return lambda value: [enc(v) for enc, v in zip(items, value, strict=True)]
        if origin in (list, tuple):
            one = self._encoder(args[0])
            return lambda value: [one(v) for v in value]
        if hint in (int, str, bool):
            return _same
        return _strict

    # -- reading ---------------------------------------------------------------------

    def decode(self, data: Any, hint: Any, path: Path = ()) -> Any:
        """``data`` read as a value of ``hint``, checked; a DecodeError where it is not."""
        return self._decoder(hint)(data, path)

    def check(self, value: Any) -> None:
        """Each field of the dataclass instance ``value`` against its hint, as
        :meth:`decode` would read it (a DecodeError at the first that is not valid)."""
        for f, hint in _fields(type(value)):
            self.decode(getattr(value, f.name), hint, (f.name,))

    def _decoder(self, hint: Any, limits: Limits | None = None) -> Decoder:
        key = (hint, limits)
        found = self._decoders.get(key)
        if found is None:
            found = self._decoders[key] = self._build(hint, limits or Limits())
        return found

    def _build(self, hint: Any, limits: Limits) -> Decoder:
        leaf = self.leaves.get(hint)
        if leaf is not None:
            return self._leaf(leaf)
        origin, args = get_origin(hint), get_args(hint)
        if origin is Annotated:
            one_of = next((a for a in args[1:] if isinstance(a, OneOf)), None)
            if one_of is not None:
                return _choice(one_of, self.dialect)
            found = next((a for a in args[1:] if isinstance(a, Limits)), limits)
            return self._decoder(args[0], found)
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self._record(hint)
        if origin in (Union, types.UnionType):
            return self._union(args)
        if origin is dict:
            return self._mapping(args[0], self._decoder(args[1]))
        if origin in (list, tuple):
            return self._array(origin, args)
        if hint in (int, float, str, bool):
            return _scalar(hint, limits, self.dialect)
        if hint is Any:
            return lambda value, path: value
        raise TypeError(f"the codec has no rule for {hint!r}")

    def _leaf(self, leaf: Leaf) -> Decoder:
        def read(value: Any, path: Path) -> Any:
            try:
                return leaf.read(value)
            except ValueError:
                self.dialect.fail(path, value, leaf.problem, leaf.valid)

        return read

    def _record(self, cls: type) -> Decoder:
        fields = [(f, f.metadata.get("key", f.name), self._decoder(h)) for f, h in _fields(cls)]
        fields = [
            (
                f,
                k,
                _example(d, f.metadata["example"], self.dialect) if "example" in f.metadata else d,
            )
            for f, k, d in fields
        ]
        keys = [k for _, k, _ in fields]
        known = frozenset(keys)
        dialect, noun = self.dialect, _noun(cls)
        listed = f"; allowed keys in {noun}: {', '.join(keys)}" if dialect.list_keys else ""

        def read(value: Any, path: Path) -> Any:
            if not isinstance(value, dict):
                dialect.fail(
                    path, value, f"is not {dialect.mapping}", f"give one with {', '.join(keys)}"
                )
            for k in () if known.issuperset(value) else value:
                if k not in known:
                    close = difflib.get_close_matches(k, keys, n=1)
                    hint = f" (did you mean {json.dumps(close[0])}?)" if close else ""
                    name = dialect.name_path((*path, k)) if path else json.dumps(k)
                    raise DecodeError(
                        f"the key {name}", value[k], f"is not a {noun} key",
                        f"remove it{hint}{listed}",
                    )  # fmt: skip
            out = {}
            for f, k, decode in fields:
                if k in value:
                    out[f.name] = decode(value[k], (*path, k))
                elif f.default is MISSING and f.default_factory is MISSING:
                    missing = dialect.missing.format(noun=noun)
                    example = f.metadata.get("example")
                    fix = dialect.restore + ("" if example is None else f", e.g. {k}: {example}")
                    dialect.fail((*path, k), ABSENT, missing, fix)
            return cls(**out)

        return read

    def _union(self, args: tuple[Any, ...]) -> Decoder:
        options = [a for a in args if a is not type(None)]
        decoders = [self._decoder(a) for a in options]
        nullable = len(options) < len(args)
        dialect = self.dialect
        names = " or ".join(_name(a, dialect) for a in options)
        if nullable:
            names += f" or {dialect.null}"

        def read(value: Any, path: Path) -> Any:
            if value is None and nullable:
                return None
            if len(decoders) == 1:
                try:
                    return decoders[0](value, path)
                except DecodeError as exc:
                    if not nullable or exc.path != dialect.name_path(path):
                        raise  # a value inside this one: null is no fix for it
                    valid = f"{exc.valid}, or {dialect.null}"
                    raise DecodeError(exc.path, exc.value, exc.problem, valid) from None
            for decode in decoders:
                try:
                    return decode(value, path)
                except DecodeError:
                    continue
            dialect.fail(path, value, f"is not {names}", f"give {names}")

        return read

    def _mapping(self, key_hint: Any, decode_value: Decoder) -> Decoder:
        decode_key = None if key_hint is str else self._decoder(key_hint)
        dialect = self.dialect

        def read(value: Any, path: Path) -> Any:
            if not isinstance(value, dict):
                dialect.fail(path, value, f"is not {dialect.mapping}", "give one keyed by name")
            if decode_key is None:
                return {k: decode_value(v, (*path, k)) for k, v in value.items()}
            out = {}
            for k, v in value.items():
                try:
                    key = decode_key(k, (*path, k))
                except DecodeError as exc:
                    raise DecodeError(f"the key {exc.path}", k, exc.problem, exc.valid) from None
                out[key] = decode_value(v, (*path, k))
            return out

        return read

    def _array(self, origin: type, args: tuple[Any, ...]) -> Decoder:
        fixed = origin is tuple and (len(args) != 2 or args[1] is not Ellipsis)
        items = [self._decoder(a) for a in (args if fixed else args[:1])]
        dialect = self.dialect

        def read(value: Any, path: Path) -> Any:
            if not isinstance(value, (list, tuple)):  # a tuple: a built value (check)
                dialect.fail(path, value, f"is not {dialect.array}", f"give {dialect.array} [...]")
            if fixed:
                if len(value) != len(items):
                    dialect.fail(path, value, f"has {len(value)} items", f"give {len(items)}")
                return tuple(
                    d(v, (*path, i)) for i, (d, v) in enumerate(zip(items, value, strict=True))
                )
            one = items[0]
            out = [one(v, (*path, i)) for i, v in enumerate(value)]
            return tuple(out) if origin is tuple else out

        return read


def _example(decode: Decoder, example: str, dialect: Dialect) -> Decoder:
    """``decode``, whose fix for the field's own value (not one inside it) gives
    ``e.g. <example>`` (``metadata={"example": ...}`` on the field), before ``or null``."""
    null = f", or {dialect.null}"

    def read(value: Any, path: Path) -> Any:
        try:
            return decode(value, path)
        except DecodeError as exc:
            if exc.path != dialect.name_path(path):
                raise
            cut = len(exc.valid) - len(null) if exc.valid.endswith(null) else len(exc.valid)
            valid = f"{exc.valid[:cut]}, e.g. {example}{exc.valid[cut:]}"
            raise DecodeError(exc.path, exc.value, exc.problem, valid) from None

    return read


def _fields(cls: Any) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = get_type_hints(cls, include_extras=True)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _is(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the union member ``hint`` (by its runtime class)."""
    origin = get_origin(hint)
    if origin is Annotated:
        return _is(value, get_args(hint)[0])
    cls = origin or hint
    if cls is Any:
        return True
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, cls) if isinstance(cls, type) else False


def _name(hint: Any, dialect: Dialect) -> str:
    origin = get_origin(hint)
    if origin is Annotated:
        return _name(get_args(hint)[0], dialect)
    if origin in (list, tuple):
        return dialect.array
    if origin is dict or dataclasses.is_dataclass(hint):
        return dialect.mapping
    return {int: "an integer", float: "a number", str: "a string", bool: dialect.booleans}.get(
        hint, str(hint)
    )


def _choice(one_of: OneOf, dialect: Dialect) -> Decoder:
    choices = one_of.choices
    allowed = ", ".join(map(json.dumps, choices)) + (f", {one_of.also}" if one_of.also else "")

    def read(value: Any, path: Path) -> Any:
        if not isinstance(value, str):
            dialect.fail(path, value, "is not a string", f"give one of {allowed}")
        if value not in choices:
            dialect.fail(path, value, "is not allowed", f"give one of {allowed}")
        return value

    return read


def _scalar(hint: type, limits: Limits, dialect: Dialect) -> Decoder:
    least, above, below, fail = limits.least, limits.above, limits.below, dialect.fail
    bound = limits.text()

    def read_str(value: Any, path: Path) -> Any:
        if not isinstance(value, str):
            fail(path, value, "is not a string", 'give a string, e.g. ""')
        return value

    def read_bool(value: Any, path: Path) -> Any:
        if not isinstance(value, bool):
            fail(path, value, f"is not {dialect.booleans}", f"give {dialect.booleans}")
        return value

    def out_of_range(value: float) -> str | None:
        """What is wrong with ``value``'s size, or None."""
        if above is None and least is not None and value < least:
            return "is negative" if least == 0 else f"is below {least:g}"
        if above is not None and not value > above:
            return "is not positive" if above == 0 else f"is not above {above:g}"
        if below is not None and not value < below:
            return f"is not below {below:g}"
        return None

    def read_int(value: Any, path: Path) -> Any:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            fail(path, value, "is not a number", f"give an integer{bound}")
        if not isinstance(value, int) or out_of_range(value):
            fail(path, value, f"is not an integer{bound}", f"give an integer{bound}")
        return value

    def read_float(value: Any, path: Path) -> Any:
        if value is None and not limits.finite:
            return math.nan  # written for a NaN or infinite value: strict JSON has neither
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            fail(path, value, "is not a number", "give a number, e.g. 0.0")
        if limits.finite and not math.isfinite(value):
            fail(path, value, "is not finite", f"give a finite number{bound or ', e.g. 0.0'}")
        problem = out_of_range(value)
        if problem is not None:
            fail(path, value, problem, f"give a number{bound}")
        return value

    return {str: read_str, bool: read_bool, int: read_int, float: read_float}[hint]


def _same(value: Any) -> Any:
    return value


def _strict(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value
