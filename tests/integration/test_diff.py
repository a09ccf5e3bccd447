"""autoplan diff and validate: two tiny MLP plans compared, run files checked without solving."""

from __future__ import annotations

import json

import pytest

from autoplan.tools.cli import main
from tests.helpers.runs import GOOD_RUN

NO_BUDGET = GOOD_RUN.replace(", memory_budget_gib: 0.001", "")
TIGHT = GOOD_RUN.replace("memory_budget_gib: 0.001", "memory_budget_gib: 0.0005")
"""0.0005 GiB is below the replicated MLP's 1 MiB of params+grads+optimizer, so
the tight plan must shard parameters the unbudgeted plan replicates."""


def _plan(tmp_path, name: str, text: str) -> str:
    run = tmp_path / f"{name}.yaml"
    run.write_text(text)
    out = tmp_path / f"{name}.json"
    assert main(["plan", str(run), "--out", str(out), "--quiet", "--json"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("plans")
    return _plan(tmp, "a", NO_BUDGET), _plan(tmp, "b", TIGHT)


def test_diff_json_lists_params_and_objective_delta(plans, capsys):
    """diff --json lists the differently placed parameters and a non-zero objective delta."""
    capsys.readouterr()
    assert main(["diff", *plans, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"objective_us", "compute_us", "comm_us", "params", "nodes_changed", "warnings"} <= set(
        d
    )
    assert d["objective_us"]["delta"] != 0
    assert d["objective_us"]["delta"] == d["objective_us"]["b"] - d["objective_us"]["a"]
    fqns = {p["fqn"] for p in d["params"]}
    assert "layers.0.w1.weight" in fqns
    assert all(p["a"] != p["b"] for p in d["params"])
    assert d["warnings"] == []


def test_diff_text_mentions_params(plans, capsys):
    """Text mode names each changed parameter with both placements."""
    capsys.readouterr()
    assert main(["diff", *plans]) == 0
    text = capsys.readouterr().out
    assert "objective" in text and "parameters placed differently" in text
    assert "layers.0.w1.weight" in text and "S(0)" in text


def test_diff_of_a_plan_with_itself_is_empty(plans, capsys):
    """A plan diffed with itself has zero deltas and no changes."""
    capsys.readouterr()
    assert main(["diff", plans[0], plans[0], "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["objective_us"]["delta"] == 0 and d["params"] == [] and d["nodes_changed"] == 0


def test_diff_corrupt_json_exits_2(plans, tmp_path, capsys):
    """A corrupt plan file exits 2 with a message naming the file."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    capsys.readouterr()
    assert main(["diff", plans[0], str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


def test_validate_good_run_file(tmp_path, capsys):
    """validate on a good run file exits 0 and reports the model and mesh."""
    run = tmp_path / "run.yaml"
    run.write_text(GOOD_RUN)
    assert main(["validate", str(run)]) == 0
    text = capsys.readouterr().out
    assert "OK" in text and "mesh: dp=8" in text and "mlp" in text


def test_validate_uneven_input_exits_2(tmp_path, capsys):
    """validate exits 2 when S(0) cannot split a batch of 6 over 8 ranks."""
    run = tmp_path / "run.yaml"
    run.write_text(GOOD_RUN.replace("batch: 16", "batch: 6"))
    assert main(["validate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "inputs.placements[0]" in err and "S(0)" in err and "[6, 32, 64]" in err
    assert "dp=8" in err
