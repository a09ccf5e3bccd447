"""The autoplan command on a tiny run file: every verb, exit codes."""

from __future__ import annotations

import json

from autoplan.core.placements import fmt
from autoplan.result.plan import Plan
from autoplan.tools.cli import main
from tests.helpers.runs import GOOD_RUN


def _run_file(tmp_path, text=GOOD_RUN):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_plan_prints_summary_and_writes_json(tmp_path, capsys):
    """plan prints the summary, writes a loadable plan, exits 0."""
    out = tmp_path / "plan.json"
    assert main(["plan", _run_file(tmp_path), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "optimal" in text and "parameter placements" in text
    assert Plan.load(out).status == "optimal"


def test_plan_json_is_deterministic(tmp_path, capsys):
    """Planning the same run twice gives the same placements."""
    path = _run_file(tmp_path)
    main(["plan", path, "--json"])
    first = json.loads(capsys.readouterr().out)
    main(["plan", path, "--json"])
    second = json.loads(capsys.readouterr().out)
    assert first["param_placements"] == second["param_placements"]
    assert first["objective_us"] == second["objective_us"]


def test_saved_plan_is_byte_identical_across_runs(tmp_path, capsys):
    """plan --out twice writes the same bytes (no timings in the file) and the file loads."""
    path = _run_file(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["plan", path, "--out", str(a), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plan", path, "--out", str(b), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["timings"]) >= {"trace", "solve"}
    assert a.read_bytes() == b.read_bytes()
    assert "timings" not in json.loads(a.read_text())
    loaded = Plan.load(a)
    assert loaded.timings == {} and loaded.status == "optimal"
    assert loaded.to_json() + "\n" == a.read_text()
    assert "phases" not in loaded.summary() and "estimated step" in loaded.summary()


def test_infeasible_exits_1_and_bad_input_exits_2(tmp_path, capsys):
    """Exit 1 when no plan fits, 2 for a bad run file."""
    tight = GOOD_RUN.replace("memory_budget_gib: 0.001", "memory_budget_gib: 0.0000001")
    assert main(["plan", _run_file(tmp_path, tight), "--quiet"]) == 1
    assert "infeasible" in capsys.readouterr().out
    assert main(["plan", _run_file(tmp_path, GOOD_RUN.replace("mlp", "gpt5"))]) == 2
    assert "model.name" in capsys.readouterr().err


def test_compare_json_has_both_modes(tmp_path, capsys):
    """compare --json reports both mm modes and the placement diff."""
    assert main(["compare", _run_file(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for mode in ("einsum", "native"):
        row = result[mode]
        assert row["status"] == "optimal"
        for key in ("objective_us", "compute_us", "comm_us", "timings", "ilp_size", "graph_nodes"):
            assert key in row
        assert (
            row["mm_strategies_mean"] > 0 and row["mm_strategies_max"] >= row["mm_strategies_mean"]
        )
    assert "param_placement_diff" in result


def test_collectives_json_rows(capsys):
    """collectives --json lists op, ranks, nodes, bytes, time and bus bandwidth."""
    assert main(["collectives", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["op"] for r in rows} == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}
    assert set(rows[0]) == {"op", "ranks", "nodes", "bytes", "time_us", "busbw_GBps"}


def test_run_file_pins_and_output_placement_reach_the_plan(tmp_path, capsys):
    """constraints.pin and constraints.output_placements are honoured; validate lists them."""
    pinned = (
        GOOD_RUN + 'constraints: {output_placements: ["R"], pin: {layers.0.w1.weight: "S(1)"}}\n'
    )
    path = _run_file(tmp_path, pinned)
    assert main(["validate", path]) == 0
    shown = capsys.readouterr().out
    assert "output placements: R" in shown and "pins: layers.0.w1.weight=S(1)" in shown
    out = tmp_path / "plan.json"
    assert main(["plan", path, "--out", str(out), "--quiet"]) == 0
    plan = Plan.load(str(out))
    assert fmt(plan.param_placements["layers.0.w1.weight"]) == "S(1)"
    assert fmt(plan.param_placements["layers.1.w1.weight"]) != "S(1)"  # its twin is not pinned


def test_bad_pins_exit_2_naming_the_pin(tmp_path, capsys):
    """A pin on an unknown name, or one that does not divide the parameter, is bad input."""
    typo = GOOD_RUN + "constraints: {pin: {layers.0.w1.weigh: R}}\n"
    assert main(["plan", _run_file(tmp_path, typo), "--quiet"]) == 2
    assert "closest: layers.0.w1.weight" in capsys.readouterr().err
    uneven = GOOD_RUN.replace("shape: [8]", "shape: [3]").replace('["S(0)"]', '["R"]')
    uneven += "constraints: {pin: {layers.0.w1.weight: S(0)}}\n"
    assert main(["validate", _run_file(tmp_path, uneven)]) == 2
    assert "constraints.pin.layers.0.w1.weight = S(0) does not fit" in capsys.readouterr().err


def test_plan_shows_each_phase_with_its_seconds(tmp_path, capsys):
    """Without --quiet every phase gets a line on stderr with its wall time; stdout is the plan."""
    assert main(["plan", _run_file(tmp_path)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert "mesh dp=8, mm_mode einsum, solver cbc" in lines[0]
    for phase in ("trace", "rewrite", "strategies", "cost", "ilp_build", "solve"):
        assert any(line.split()[:1] == [phase] and line.endswith(" s") for line in lines), phase
    assert captured.out.startswith("autoplan plan")
