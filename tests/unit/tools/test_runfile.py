"""YAML run files: every class of mistake names the file, the key and the fix."""

from __future__ import annotations

import textwrap

import pytest

from autoplan.tools.runfile import RunFileError, load_run
from tests.helpers.runs import GOOD_RUN


def _write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_good_run_file_loads(tmp_path):
    """A valid file maps onto the run and its PlanConfig."""
    run = load_run(_write(tmp_path, GOOD_RUN))
    assert run.mesh_shape == (8,) and run.axis_names == ("dp",)
    assert run.config.memory_budget_gib == 0.001
    assert run.build_model() is not None


def test_set_overrides_any_key(tmp_path):
    """--set model.args.n_layers=4 changes that key."""
    run = load_run(_write(tmp_path, GOOD_RUN), ["model.args.n_layers=4", "plan.mm_mode=native"])
    assert run.model_args["n_layers"] == 4 and run.config.mm_mode == "native"


def test_set_of_a_top_level_key_that_does_not_exist_is_refused(tmp_path):
    """--set mm_mode=native (plan. forgotten) is an error, not silently ignored."""
    with pytest.raises(RunFileError, match="unknown top-level key 'mm_mode'"):
        load_run(_write(tmp_path, GOOD_RUN), ["mm_mode=native"])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (("topology: h100", "topology: h100\nextra: 1"), "unknown top-level key 'extra'"),
        (("plan: {", "plan: {colour: red, "), "the key plan.colour"),
        (("hidden: 256", "hidden: 256, width: 3"), "unknown key model.args.width"),
        (("name: mlp", "name: gpt5"), 'model.name = "gpt5"'),
        (("shape: [8]", "shape: [0]"), "mesh.shape[0] = 0"),
        (("names: [dp]", "names: [dp, tp]"), "mesh.names"),
        (('"S(0)"', '"Q(0)"'), "inputs.placements"),
        (('"S(0)"', '"S(0)R"'), "mesh has 1 axes"),
        (("mm_mode: einsum", "mm_mode: fast"), 'plan.mm_mode = "fast"'),
        (("memory_budget_gib: 0.001", "memory_budget_gib: -1"), "plan.memory_budget_gib = -1"),
        (("topology: h100", "topology: tpu"), "Unknown topology preset 'tpu'"),
        (("batch: 16", "batch: many"), 'inputs.batch = "many"'),
        (
            ("topology: h100", "topology: h100\nconstraints: {pin: {layers.0.w1.weight: S(9}}"),
            "constraints.pin.layers.0.w1.weight",
        ),
        (("topology: h100", "topology: h100\nconstraints: {pin: [a]}"), 'constraints.pin = ["a"]'),
        (
            ("topology: h100", "topology: h100\nconstraints: {output_placements: [R, R]}"),
            "constraints.output_placements",
        ),
        (("topology: h100", "topology: h100\nconstraints: {outputs: [R]}"), "constraints.outputs"),
    ],
)
def test_each_mistake_has_its_message(tmp_path, change, needle):
    """Bad keys, types and values raise RunFileError naming file, key and value."""
    old, new = change
    assert old in GOOD_RUN
    path = _write(tmp_path, GOOD_RUN.replace(old, new))
    with pytest.raises(RunFileError) as info:
        load_run(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path):
    """A missing file and broken YAML are RunFileErrors too."""
    with pytest.raises(RunFileError, match="no such run file"):
        load_run(tmp_path / "nope.yaml")
    with pytest.raises(RunFileError, match="not valid YAML"):
        load_run(_write(tmp_path, "model: [unclosed"))
