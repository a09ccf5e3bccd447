"""A run file's sections read by the codec's walk (autoplan.tools.run_sections): each
refusal names the file, the dotted key path, the value and the fix, and the plan section
refuses exactly what PlanConfig refuses from Python."""

from __future__ import annotations

import math

import pytest

from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError, RunFileError
from autoplan.tools.run_sections import (
    ConstraintsSection,
    InputsSection,
    MeshSection,
    ModelSection,
    read_section,
)

SOURCE = "run.yaml"


def _refused(raw, name, cls):
    with pytest.raises(RunFileError) as info:
        read_section(raw, name, cls, SOURCE)
    return str(info.value)


def test_sections_left_out_take_their_defaults():
    """No inputs, plan or constraints section: every default; mesh needs its keys."""
    assert read_section({}, "inputs", InputsSection, SOURCE) == InputsSection()
    assert read_section({"plan": None}, "plan", PlanConfig, SOURCE) == PlanConfig()
    assert read_section({}, "constraints", ConstraintsSection, SOURCE).pin is None
    text = _refused({}, "mesh", MeshSection)
    assert text.startswith("run.yaml: mesh.shape is missing") and "e.g. shape: [8, 8]" in text


def test_a_section_is_read_into_its_record():
    """Lists become tuples, values keep their types (an int budget stays an int)."""
    raw = {
        "mesh": {"shape": [2, 4], "names": ["dp", "tp"]},
        "plan": {"memory_budget_gib": 4, "mm_mode": "native"},
    }
    assert read_section(raw, "mesh", MeshSection, SOURCE) == MeshSection((2, 4), ("dp", "tp"))
    config = read_section(raw, "plan", PlanConfig, SOURCE)
    assert config.memory_budget_gib == 4 and type(config.memory_budget_gib) is int


@pytest.mark.parametrize(
    ("raw", "name", "cls", "words"),
    [
        ({"mesh": {"shape": [2, 0], "names": ["a", "b"]}}, "mesh", MeshSection,
         ["mesh.shape[1] = 0", "give an integer >= 1"]),
        ({"mesh": [2]}, "mesh", MeshSection, ["mesh = [2] is not a mapping", "shape, names"]),
        ({"inputs": {"batch": 2.5}}, "inputs", InputsSection, ["inputs.batch = 2.5", ">= 1"]),
        ({"inputs": {"placements": [1]}}, "inputs", InputsSection,
         ["inputs.placements[0] = 1", 'placement such as "S(0)R"']),
        ({"inputs": {"placements": "S(0)R"}}, "inputs", InputsSection,
         ['inputs.placements = "S(0)R" is not a list', 'e.g. ["S(0)R"], or null']),
        ({"constraints": {"pin": ["a"]}}, "constraints", ConstraintsSection,
         ['constraints.pin = ["a"]', 'e.g. {output.weight: "RS(0)"}']),
        ({"plan": {"topology": "h100"}}, "plan", PlanConfig,
         ['plan.topology = "h100"', "move it to the top level"]),
        ({"plan": {"mm_mod": "native"}}, "plan", PlanConfig,
         ["the key plan.mm_mod", 'did you mean "mm_mode"', "allowed keys in plan: mm_mode"]),
        ({"plan": {"mip_gap": 1}}, "plan", PlanConfig, ["plan.mip_gap = 1", ">= 0 and < 1"]),
        ({"model": {"name": "gpt5"}}, "model", ModelSection,
         ['model.name = "gpt5"', '"llama3", "moe", "mlp", or model.hf']),
        ({"model": {"args": [1]}}, "model", ModelSection,
         ["model.args = [1] is not a mapping", "e.g. {n_layers: 2}"]),
        ({"model": {"hf": "bert"}}, "model", ModelSection, ['model.hf = "bert"', '"llama"']),
        ({"plan": {"solver": "gurobi"}}, "plan", PlanConfig,
         ['plan.solver = "gurobi"', '"cbc", "highs"']),
    ],
)  # fmt: skip
def test_each_refusal_names_file_key_value_and_fix(raw, name, cls, words):
    """The message starts with the file and holds the key path, the value and the fix."""
    text = _refused(raw, name, cls)
    assert text.startswith(f"{SOURCE}: ")
    for word in words:
        assert word in text, (word, text)


PLAN_VALUES = [
    ("memory_budget_gib", v) for v in (None, 1, 0.5, 0, -1, math.inf, math.nan, "4", True)
] + [
    ("time_limit_s", v) for v in (None, 600, 0, -3.0, math.inf)
] + [("mip_gap", v) for v in (0, 0.5, 1, -0.1, True)] + [
    ("optimizer_states", v) for v in (0, 2, -1, 1.5, True)
] + [("bucket_mib", v) for v in (0, 25, -1, math.inf)] + [
    ("mm_mode", v) for v in ("einsum", "native", "fast", 3)
] + [
    ("activation_checkpointing", v) for v in ("auto", "full", "yes")
] + [("param_dtype", v) for v in (None, "bfloat16", "bf16")] + [
    ("routes", v) for v in (True, False, 1, "yes")
]  # fmt: skip


@pytest.mark.parametrize(("key", "value"), PLAN_VALUES, ids=[f"{k}={v!r}" for k, v in PLAN_VALUES])
def test_plan_section_refuses_what_python_refuses(key, value):
    """A plan value is refused from YAML exactly when PlanConfig(**{key: value}) refuses it."""
    try:
        PlanConfig(**{key: value})
        python_ok = True
    except PlanError:
        python_ok = False
    try:
        read_section({"plan": {key: value}}, "plan", PlanConfig, SOURCE)
        yaml_ok = True
    except RunFileError as exc:
        assert f"plan.{key} = " in str(exc)
        yaml_ok = False
    assert python_ok == yaml_ok
