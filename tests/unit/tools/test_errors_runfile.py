"""Bad run files: each one refused by ``validate`` and ``plan`` alike, exit 2, one clear line.

Every case names what is wrong and the words of its fix; none may reach the solver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.tools.runfile import load_run
from tests.helpers.bad_input import assert_clear, assert_plan_error, cli
from tests.helpers.runs import TINY_RUN

MODEL = "model:\n  name: llama3\n  args: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 128, multiple_of: 32, max_seq_len: 32}\n"  # noqa: E501


def _swap(old: str, new: str) -> str:
    assert old in TINY_RUN, old
    return TINY_RUN.replace(old, new)


# (case id, run file text, words the message must hold)
BAD_FILES = [
    ("duplicate-section", TINY_RUN + "mesh: {shape: [4], names: [dp]}\n", ["'mesh' appears twice"]),
    (
        "duplicate-key",
        _swap("solver: cbc}", "solver: cbc, solver: highs}"),
        ["'solver' appears twice"],
    ),
    (
        "anchor",
        _swap("mesh: {shape: [2, 2]", "mesh: {shape: &s [2, 2]"),
        ["anchor &s", "write each value"],
    ),
    ("merge-key", TINY_RUN + "constraints: {<<: {pin: {}}}\n", ["merge key"]),
    (
        "yes-as-bool",
        _swap("solver: cbc}", "solver: cbc, cluster_layers: yes}"),
        ["'yes'", "true or false"],
    ),
    ("octal-int", _swap("batch: 8", "batch: 010"), ["'010'", "decimal"]),
    ("hex-int", _swap("batch: 8", "batch: 0x8"), ["'0x8'", "decimal"]),
    ("base-60", _swap("batch: 8", "batch: 1:30"), ["'1:30'", "decimal"]),
    (
        "infinite-time",
        _swap("solver: cbc}", "solver: cbc, time_limit_s: .inf}"),
        ["'.inf'", "finite"],
    ),
    ("nan-gap", _swap("solver: cbc}", "solver: cbc, mip_gap: .nan}"), ["'.nan'", "finite"]),
    ("date", _swap("names: [dp, tp]", "names: [2026-01-01, tp]"), ["date", "quote it"]),
    ("set-tag", _swap("names: [dp, tp]", "names: !!set {dp, tp}"), ["tag", "lists and mappings"]),
    ("custom-tag", _swap("topology: h100", "topology: !gpu h100"), ["tag !gpu"]),
    ("int-key", TINY_RUN + "constraints: {pin: {1: RR}}\n", ["key 1 is not a name"]),
    ("syntax", _swap("[2, 2]", "[2, 2"), ["not valid YAML", "close every bracket"]),
    ("empty-file", "", ["a run file is a mapping"]),
    ("top-level-list", "- model\n- mesh\n", ["a run file is a mapping"]),
    (
        "unknown-section",
        TINY_RUN + "optimizer: adam\n",
        ["unknown top-level key 'optimizer'", "allowed"],
    ),
    ("plan-key-typo", _swap("mm_mode: einsum", "mm_mod: einsum"), ["plan.mm_mod", "allowed keys"]),
    ("mm-mode-value", _swap("mm_mode: einsum", "mm_mode: einsun"), ["einsun", "einsum"]),
    ("solver-value", _swap("solver: cbc", "solver: gurobi"), ["gurobi", "cbc"]),
    ("seq-over-max", _swap("seq: 32", "seq: 64"), ["inputs.seq", "max_seq_len"]),
    ("zero-axis", _swap("shape: [2, 2]", "shape: [0, 2]"), ["mesh.shape", ">= 1"]),
    ("bool-batch", _swap("batch: 8", "batch: true"), ["inputs.batch", "integer"]),
    ("names-count", _swap("names: [dp, tp]", "names: [dp]"), ["mesh.names", "2 axis names"]),
    ("names-repeat", _swap("names: [dp, tp]", "names: [dp, dp]"), ["distinct"]),
    (
        "placements-string",
        _swap('placements: ["S(0)R"]', 'placements: "S(0)R"'),
        ["inputs.placements", "a list"],
    ),
    ("placement-syntax", _swap('["S(0)R"]', '["X(0)R"]'), ["X(0)R", "allowed per mesh axis"]),
    ("placement-axes", _swap('["S(0)R"]', '["S(0)"]'), ["S(0)", "2"]),
    ("placement-dim", _swap('["S(0)R"]', '["S(5)R"]'), ["inputs.placements[0] = S(5)R", "below 2"]),
    (
        "placements-count",
        _swap('["S(0)R"]', '["S(0)R", "RR"]'),
        ["inputs.placements = [S(0)R, RR]", "model takes 1 input", "[8, 32]", "one placement"],
    ),
    ("placement-uneven", _swap("shape: [2, 2]", "shape: [3, 2]"), ["S(0)R", "multiple of"]),
    (
        "output-dim",
        TINY_RUN + 'constraints: {output_placements: ["S(3)R"]}\n',
        ["output_placements[0] = S(3)R", "below 3"],
    ),
    (
        "pin-dim",
        TINY_RUN + "constraints: {pin: {output.weight: S(2)R}}\n",
        ["constraints.pin.output.weight", "below 2"],
    ),
    ("model-name", _swap("name: llama3", "name: gpt5"), ["model.name", "llama3"]),
    ("model-arg", _swap("dim: 64,", "dim: 64, width: 3,"), ["model.args.width", "allowed"]),
    ("model-heads", _swap("n_heads: 4", "n_heads: 5"), ["n_heads"]),
    (
        "budget-negative",
        _swap("solver: cbc}", "solver: cbc, memory_budget_gib: -1}"),
        ["memory_budget_gib", "-1"],
    ),
    ("topology-preset", _swap("topology: h100", "topology: h900"), ["h900", "h100"]),
    (
        "topology-file",
        _swap("topology: h100", "topology: missing.yaml"),
        ["missing.yaml", "no such topology file"],
    ),
]


@pytest.mark.parametrize(
    ("text", "words"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_run_file_is_refused_by_validate_and_plan(tmp_path, text, words):
    """validate and plan both exit 2 with the message; load_run raises it as a PlanError."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    for command in ("validate", "plan"):
        ran = cli(command, str(path), *(["--quiet"] if command == "plan" else []))
        assert_clear(ran, 2, *words)
        assert len(ran.err.strip().splitlines()) == 1, ran.err
        assert "OK" not in ran.out
    assert_plan_error(lambda: _check(path), *words)


def _check(path: Path) -> None:
    from autoplan.tools.run_checks import check_run

    check_run(load_run(path))


def test_run_file_that_is_a_directory(tmp_path):
    """A directory given as the run file is named as one."""
    assert_clear(cli("validate", str(tmp_path)), 2, "is a directory", ".yaml")


def test_run_file_missing(tmp_path):
    """A run file that does not exist: its path and 'no such run file'."""
    assert_clear(cli("plan", str(tmp_path / "nope.yaml")), 2, "nope.yaml", "no such run file")


def test_run_file_not_utf8(tmp_path):
    """A binary file given as the run file: not UTF-8 text."""
    path = tmp_path / "run.yaml"
    path.write_bytes(b"model: \xff\xfe\n")
    assert_clear(cli("validate", str(path)), 2, "not UTF-8")


def test_run_file_too_large(tmp_path):
    """A file over 1 MiB is not a run file someone wrote."""
    path = tmp_path / "run.yaml"
    path.write_text(TINY_RUN + "# " + "x" * (1 << 20) + "\n")
    assert_clear(cli("validate", str(path)), 2, "larger than a run file needs")


def test_strict_yaml_keeps_what_run_files_use(tmp_path):
    """The strict reader still reads 1e3 as a number, true/false, null and quoted 'no'."""
    path = tmp_path / "run.yaml"
    path.write_text(
        _swap("solver: cbc}", "solver: cbc, time_limit_s: 1e3, cluster_layers: false}")
        + "constraints: {pin: {output.weight: 'RR'}}\n"
    )
    run = load_run(path)
    assert run.config.time_limit_s == 1000.0 and run.config.cluster_layers is False
    assert MODEL in TINY_RUN
