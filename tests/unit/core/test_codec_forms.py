"""The codec's vocabulary (autoplan.core.codec_forms): strict bounds, the three dialects'
wording of one refusal, a field's example in its fix, and Codec.check of a built value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

import pytest

from autoplan.core.codec import Codec, Limits, OneOf
from autoplan.core.codec_forms import JSON, PYTHON, YAML, dotted
from autoplan.core.json_errors import DecodeError


@dataclass(frozen=True)
class Knobs:
    NOUN = "knobs"

    gap: Annotated[float, Limits(below=1)] = 0.0
    budget: Annotated[float, Limits(above=0)] | None = None
    mode: Annotated[str, OneOf(("a", "b"))] = "a"
    shape: tuple[Annotated[int, Limits(least=1)], ...] = field(
        default=(1,), metadata={"example": "[8, 8]"}
    )
    on: bool = True


@dataclass(frozen=True)
class Doc:
    knobs: Knobs
    sizes: list[int] | None = None


def _refusal(dialect, data, hint=Doc):
    with pytest.raises(DecodeError) as info:
        Codec(dialect=dialect).decode(data, hint)
    return info.value


@pytest.mark.parametrize(
    ("value", "accepted"),
    [(0.0, True), (0.999, True), (1, False), (-0.5, False), (math.inf, False)],
)
def test_limits_below_is_strict(value, accepted):
    """Limits(below=1) takes [0, 1): 1 and negatives and infinity are refused."""
    data = {"knobs": {"gap": value}}
    if accepted:
        assert Codec().decode(data, Doc).knobs.gap == value
    else:
        assert ">= 0 and < 1" in str(_refusal(JSON, data))


@pytest.mark.parametrize("value", [0, -1, 0.0, math.nan])
def test_limits_above_refuses_zero(value):
    """Limits(above=0) refuses 0 itself, negatives and NaN; its fix says > 0, or null."""
    exc = _refusal(JSON, {"knobs": {"budget": value}})
    assert exc.valid.endswith("> 0, or null"), exc.valid


def test_limits_text():
    """The bounds as a fix words them."""
    assert Limits().text() == " >= 0"
    assert Limits(least=None).text() == ""
    assert Limits(above=0).text() == " > 0"
    assert Limits(below=1).text() == " >= 0 and < 1"


def test_dotted_names_a_yaml_key_path():
    """Keys joined by dots, positions in brackets."""
    assert dotted(("plan", "memory_budget_gib")) == "plan.memory_budget_gib"
    assert dotted(("mesh", "shape", 0)) == "mesh.shape[0]"
    assert dotted(("constraints", "pin", "layers.0.w")) == "constraints.pin.layers.0.w"


@pytest.mark.parametrize(
    ("dialect", "path", "words"),
    [
        (JSON, 'knobs["shape"]', "a JSON array"),
        (YAML, "knobs.shape", "a list"),
        (PYTHON, "knobs.shape", "a list or tuple"),
    ],
)
def test_each_dialect_words_the_same_refusal(dialect, path, words):
    """One walk, one refusal; the key path and the form's name follow the dialect."""
    exc = _refusal(dialect, {"knobs": {"shape": 3}})
    assert exc.path == path and exc.problem == f"is not {words}"


def test_a_fields_example_ends_its_fix_but_not_an_inner_values():
    """The example is given for the field's own value, not for an item inside it."""
    own = _refusal(YAML, {"knobs": {"shape": 3}})
    assert own.valid.endswith("e.g. [8, 8]")
    inner = _refusal(YAML, {"knobs": {"shape": [0]}})
    assert inner.path == "knobs.shape[0]" and "e.g." not in inner.valid


def test_null_is_offered_only_for_the_nullable_value_itself():
    """An item inside a nullable list is not fixed by null."""
    assert _refusal(YAML, {"knobs": {}, "sizes": 3}).valid.endswith(", or null")
    assert "null" not in _refusal(YAML, {"knobs": {}, "sizes": ["x"]}).valid


def test_an_unknown_key_in_yaml_lists_the_allowed_keys():
    """YAML's fix lists the record's keys and the close match; JSON's names the match only."""
    yaml = _refusal(YAML, {"knobs": {"mdoe": "a"}})
    assert yaml.path == "the key knobs.mdoe" and 'did you mean "mode"' in yaml.valid
    assert "allowed keys in knobs: gap, budget, mode, shape, on" in yaml.valid
    assert "allowed" not in _refusal(JSON, {"knobs": {"mdoe": "a"}}).valid


def test_a_missing_key_is_worded_by_the_dialect():
    """A missing record key: JSON says restore it, YAML says add it."""
    assert _refusal(JSON, {}).valid == "restore it"
    assert _refusal(YAML, {}).valid == "add it"


def test_check_reads_a_built_value_as_decode_would():
    """Codec.check refuses a built record's bad field (Python words) and passes a good one."""
    codec = Codec(dialect=PYTHON)
    codec.check(Knobs(gap=0.5, budget=2, shape=(2, 4)))
    with pytest.raises(DecodeError) as info:
        codec.check(Knobs(on=1))  # type: ignore[arg-type]
    assert info.value.path == "on" and info.value.valid == "give True or False"
    with pytest.raises(DecodeError) as info:
        codec.check(Knobs(budget=None, mode="c"))
    assert info.value.path == "mode" and '"a", "b"' in info.value.valid
