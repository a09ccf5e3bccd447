"""Bad command lines: usage mistakes, --set overrides, output paths, exit codes.

Each case exits with the documented code (2 bad input, 1 infeasible, 3 internal),
prints one clear line and no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import autoplan.tools.run_plan
from tests.helpers.bad_input import assert_clear, cli
from tests.helpers.paths import CONFIGS
from tests.helpers.runs import TINY_RUN


@pytest.fixture
def run_file(tmp_path: Path) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(TINY_RUN)
    return str(path)


# (case id, argv with {run} for the run file and {tmp} for a temporary directory, words)
BAD_COMMANDS = [
    ("no-command", [], ["required"]),
    ("unknown-command", ["solve", "{run}"], ["invalid choice"]),
    ("plan-no-file", ["plan"], ["required", "config"]),
    ("unknown-flag", ["plan", "{run}", "--fast"], ["unrecognized arguments: --fast"]),
    ("mm-mode-choice", ["plan", "{run}", "--mm-mode", "einsun"], ["invalid choice", "einsum"]),
    ("set-no-equals", ["plan", "{run}", "--set", "plan.mm_mode"], ["key.path=value"]),
    (
        "set-bad-yaml",
        ["plan", "{run}", "--set", "mesh.shape=[2,2"],
        ["mesh.shape=[2,2", "not valid YAML"],
    ),
    ("set-empty-part", ["plan", "{run}", "--set", "plan..solver=cbc"], ["empty part"]),
    ("set-empty-key", ["plan", "{run}", "--set", "=3"], ["empty part"]),
    ("set-through-list", ["plan", "{run}", "--set", "mesh.shape.x=1"], ["shape", "not a mapping"]),
    (
        "set-unknown-section",
        ["plan", "{run}", "--set", "mm_mode=native"],
        ["unknown top-level key 'mm_mode'"],
    ),
    ("set-inf", ["plan", "{run}", "--set", "plan.time_limit_s=.inf"], ["finite"]),
    (
        "set-seq",
        ["validate", "{run}", "--set", "inputs.seq=64"],
        ["inputs.seq = 64", "max_seq_len"],
    ),
    ("set-dup", ["plan", "{run}", "--set", "plan={solver: cbc, solver: highs}"], ["appears twice"]),
    (
        "out-missing-dir",
        ["plan", "{run}", "--out", "{tmp}/no/such/plan.json"],
        ["does not exist", "mkdir -p"],
    ),
    ("out-is-dir", ["plan", "{run}", "--out", "{tmp}"], ["is a directory", "plan.json"]),
    ("compare-out-json-is-dir", ["compare", "{run}", "--out", "{tmp}/x/"], []),
    (
        "explain-top-0",
        ["explain", "{tmp}/p.json", "ps_1", "--config", "{run}", "--top", "0"],
        ["--top"],
    ),
    ("explain-no-config", ["explain", "{tmp}/p.json", "ps_1"], ["--config"]),
    (
        "explain-top-text",
        ["explain", "{tmp}/p.json", "ps_1", "--config", "{run}", "--top", "x"],
        ["invalid int"],
    ),
    ("diff-missing", ["diff", "{tmp}/a.json", "{tmp}/b.json"], ["a.json"]),
    ("collectives-preset", ["collectives", "--topology", "h900"], ["h900", "h100"]),
    ("collectives-file", ["collectives", "--topology", "{tmp}/none.yaml"], ["none.yaml"]),
    ("validate-missing", ["validate", "{tmp}/none.yaml"], ["no such run file"]),
]


@pytest.mark.parametrize(
    ("argv", "words"), [c[1:] for c in BAD_COMMANDS], ids=[c[0] for c in BAD_COMMANDS]
)
def test_bad_command_line_exits_2(tmp_path, run_file, argv, words):
    """A usage mistake exits 2 with one clear message and no traceback."""
    args = [a.replace("{run}", run_file).replace("{tmp}", str(tmp_path)) for a in argv]
    ran = cli(*args)
    if args[:1] == ["compare"]:  # a directory where compare.json goes: writes inside it
        assert_clear(ran, 0)
        assert (tmp_path / "x" / "compare.json").exists()
        return
    assert_clear(ran, 2, *words)


def test_out_is_checked_before_solving(tmp_path, run_file, monkeypatch):
    """A bad --out is refused before planning starts: the planner is never called."""
    monkeypatch.setattr(
        autoplan.tools.run_plan, "plan", lambda *a, **k: pytest.fail("planned anyway")
    )
    assert_clear(cli("plan", run_file, "--out", str(tmp_path / "no" / "p.json")), 2, "mkdir")


def test_infeasible_exits_1_with_its_reason(run_file):
    """A budget no plan fits: exit 1 (not 2), the reason on stdout, no traceback."""
    ran = cli("plan", run_file, "--quiet", "--set", "plan.memory_budget_gib=1e-7")
    assert_clear(ran, 1)
    assert "raise the budget" in ran.out


def test_compare_infeasible_says_why_without_nan(run_file):
    """compare with a budget neither mode fits: exit 1, each mode's reason, no NaN anywhere."""
    ran = cli("compare", run_file, "--set", "plan.memory_budget_gib=1e-7")
    assert_clear(ran, 1)
    assert "einsum: infeasible" in ran.out and "native: infeasible" in ran.out
    assert "nan" not in ran.out.lower()
    ran = cli("compare", run_file, "--json", "--set", "plan.memory_budget_gib=1e-7")
    assert "NaN" not in ran.out and '"objective_us": null' in ran.out


def test_internal_error_is_exit_3_with_one_line(run_file, monkeypatch):
    """An unexpected exception is a defect: exit 3, one line naming it, the --debug hint."""

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(autoplan.tools.run_plan, "plan", broken)
    ran = cli("plan", run_file, "--quiet")
    assert_clear(ran, 3, "internal error: RuntimeError: boom", "--debug")
    assert "second line" not in ran.err
    debug = cli("plan", run_file, "--quiet", "--debug")
    assert debug.code == 3 and "Traceback" in debug.err and "second line" in debug.err


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A folder with run.yaml naming topo.yaml (a copy of a preset file) beside it, the same
    run as run.json, link.json (a symlink to run.yaml) and an empty folder sub/."""
    presets = CONFIGS / "topology"
    (tmp_path / "topo.yaml").write_bytes(sorted(presets.glob("*.yaml"))[0].read_bytes())
    run = TINY_RUN.replace("topology: h100", "topology: topo.yaml")
    (tmp_path / "run.yaml").write_text(run)
    (tmp_path / "run.json").write_text(run)
    (tmp_path / "link.json").symlink_to(tmp_path / "run.yaml")
    (tmp_path / "sub").mkdir()
    return tmp_path


# (case id, command, its run file, the --out given, the input file that --out names)
OVERWRITES = [
    ("plan-out-run", "plan", "run.yaml", "{tmp}/run.yaml", "run.yaml"),
    ("plan-out-run-relative", "plan", "{tmp}/run.yaml", "run.yaml", "run.yaml"),
    ("plan-out-run-other-spelling", "plan", "run.yaml", "{tmp}/sub/../run.yaml", "run.yaml"),
    ("plan-out-run-symlink", "plan", "run.yaml", "{tmp}/link.json", "run.yaml"),
    ("plan-out-topology", "plan", "run.yaml", "{tmp}/topo.yaml", "topo.yaml"),
    ("compare-out-run", "compare", "run.json", "{tmp}/run.json", "run.json"),
]


@pytest.mark.parametrize(
    ("command", "config", "out", "victim"),
    [c[1:] for c in OVERWRITES],
    ids=[c[0] for c in OVERWRITES],
)
def test_out_never_overwrites_an_input(inputs, monkeypatch, command, config, out, victim):
    """--out naming the run file (any spelling, a symlink) or its topology file is refused
    before planning, naming both paths and the fix; the input is left byte for byte."""
    monkeypatch.setattr(
        autoplan.tools.run_plan, "plan", lambda *a, **k: pytest.fail("planned anyway")
    )
    monkeypatch.chdir(inputs)
    before = {p.name: p.read_bytes() for p in inputs.iterdir() if p.is_file()}
    out = out.replace("{tmp}", str(inputs))
    ran = cli(command, config.replace("{tmp}", str(inputs)), "--out", out)
    what = "topology file" if victim == "topo.yaml" else "run file"
    written = out if command == "plan" else Path(out).with_suffix(".json")  # compare: X.json
    assert_clear(ran, 2, f"--out {written}", what, victim, "another file")
    assert {p.name: p.read_bytes() for p in inputs.iterdir() if p.is_file()} == before
