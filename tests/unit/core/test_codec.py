"""The type-driven JSON codec (autoplan.core.codec): what it writes it reads back as the
same value, for values drawn at random from the types' own hints, and what it refuses
it names by key path, value, problem and what is allowed."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import pytest

from autoplan.core.codec import Codec, Leaf, Limits, OneOf
from autoplan.core.json_errors import DecodeError, read_json


@dataclass(frozen=True)
class Point:
    """A leaf: written "x,y"."""

    x: int
    y: int


def _read_point(text: Any) -> Point:
    x, y = str(text).split(",")
    return Point(int(x), int(y))


@dataclass(frozen=True)
class Inner:
    name: str
    size: Annotated[int, Limits(least=1)]
    where: Annotated[str, OneOf(("head", "tail"))]
    at: Point


@dataclass(frozen=True)
class Outer:
    NOUN = "outer"

    items: dict[str, Inner]
    by_point: dict[Point, tuple[Point, ...]]
    shape: tuple[int, ...]
    pair: tuple[int, str]
    keys: tuple[int | str, ...]
    flag: bool
    maybe: float | None = None
    signed: Annotated[float, Limits(least=None)] = 0.0
    cost: Annotated[float, Limits(finite=False)] = 0.0
    renamed: list[str] = field(default_factory=list, metadata={"key": "in"})
    anything: dict[str, Any] = field(default_factory=dict)


CODEC = Codec({Point: Leaf(lambda p: f"{p.x},{p.y}", _read_point, 'give "x,y"', "is no point")})


ANY_NUMBER = Limits()


def sample(hint: Any, rng: random.Random, limits: Limits = ANY_NUMBER) -> Any:
    """A random value of ``hint``, walked from the hint as the codec walks it."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Point:
        return Point(rng.randint(0, 9), rng.randint(0, 9))
    if origin is Annotated:
        choices = next((a.choices for a in args[1:] if isinstance(a, OneOf)), None)
        if choices is not None:
            return rng.choice(choices)
        return sample(args[0], rng, next(a for a in args[1:] if isinstance(a, Limits)))
    if dataclasses.is_dataclass(hint):
        hints = get_type_hints(hint, include_extras=True)
        return hint(**{f.name: sample(hints[f.name], rng) for f in dataclasses.fields(hint)})
    if origin is dict:
        return {sample(args[0], rng): sample(args[1], rng) for _ in range(rng.randint(0, 3))}
    if origin is tuple and args[-1] is not Ellipsis:
        return tuple(sample(a, rng) for a in args)
    if origin in (list, tuple):
        out = [sample(args[0], rng) for _ in range(rng.randint(0, 3))]
        return out if origin is list else tuple(out)
    if args:  # a union
        return rng.choice([sample(a, rng) if a is not type(None) else None for a in args])
    if hint is Any:
        return rng.choice([None, 1, "x", [1.5, "y"], {"z": False}])
    if hint is int:
        return rng.randint(int(limits.least or 0), 1000)
    if hint is float:
        sign = -1 if limits.least is None and rng.random() < 0.5 else 1
        return sign * rng.choice([0.0, 1.5, 1e-300, 123456789012.25, rng.random() * 1e6])
    if hint is bool:
        return rng.random() < 0.5
    return rng.choice(["", "mm", "a:0", 'q"uote', "é ü", "x" * 40])


@pytest.mark.parametrize("seed", range(50))
def test_what_is_written_reads_back_as_the_same_value(seed):
    """decode(encode(v)) == v and the written JSON is strict, for 50 random values."""
    value = sample(Outer, random.Random(seed))
    data = CODEC.encode(value, Outer)
    text = json.dumps(data, allow_nan=False, sort_keys=True)
    assert CODEC.decode(read_json(text), Outer) == value
    assert "in" in data and "renamed" not in data  # the field's key, not its name


def test_a_non_finite_cost_is_written_null_and_read_as_nan():
    """Limits(finite=False): NaN and infinity write null and read back as NaN."""
    for bad in (math.nan, math.inf):
        value = sample(Outer, random.Random(0))
        data = CODEC.encode(dataclasses.replace(value, cost=bad), Outer)
        assert data["cost"] is None
        assert math.isnan(CODEC.decode(data, Outer).cost)


def _data() -> dict[str, Any]:
    return CODEC.encode(sample(Outer, random.Random(1)), Outer) | {
        "items": {"a": {"name": "n", "size": 2, "where": "head", "at": "1,2"}}
    }


BAD: dict[str, tuple[Any, str, list[str]]] = {
    # id: (change to the valid data, the path named, words of the message)
    "size-0": (lambda d: d["items"]["a"].update(size=0), 'items["a"]["size"]', [">= 1"]),
    "where": (lambda d: d["items"]["a"].update(where="mid"), 'items["a"]["where"]', ['"head"']),
    "leaf": (lambda d: d["items"]["a"].update(at="1;2"), 'items["a"]["at"]', ["is no point"]),
    "key-leaf": (lambda d: d.update(by_point={"oops": []}), 'the key by_point["oops"]', []),
    "unknown": (lambda d: d.update(shap=[1]), 'the key "shap"', ['"shape"', "not a outer key"]),
    "missing": (lambda d: d.pop("shape"), "shape", ["is missing", "every outer records it"]),
    "not-number": (lambda d: d.update(signed="1"), "signed", ["not a number"]),
    "not-finite": (lambda d: d.update(maybe=math.inf), "maybe", ["not finite"]),
    "negative": (lambda d: d.update(maybe=-1.0), "maybe", ["is negative", ">= 0"]),
    "bool-as-int": (lambda d: d.update(shape=[True]), "shape[0]", ["not a number"]),
    "pair-length": (lambda d: d.update(pair=[1]), "pair", ["has 1 items"]),
    "union": (lambda d: d.update(keys=[1.5]), "keys[0]", ["an integer or a string"]),
    "not-object": (lambda d: d.update(items=[]), "items", ["not a JSON object"]),
    "not-array": (lambda d: d.update(shape={}), "shape", ["not a JSON array"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_value_is_named_by_its_key_path(case):
    """Each refusal names the key path, the value and what is allowed."""
    change, path, words = BAD[case]
    data = _data()
    change(data)
    with pytest.raises(DecodeError) as err:
        CODEC.decode(data, Outer)
    assert err.value.path == path, str(err.value)
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ["is empty"]),
        ('{"a": 1', ["not valid JSON", "line 1"]),
        ('{"a": 1, "a": 2}', ['repeats the key "a"']),
    ],
)
def test_a_bad_document_is_named_as_the_whole_file(text, words):
    """Empty, truncated or repeated-key JSON is refused about the whole file."""
    with pytest.raises(DecodeError) as err:
        read_json(text)
    assert err.value.path is None and all(w in str(err.value) for w in words), str(err.value)
