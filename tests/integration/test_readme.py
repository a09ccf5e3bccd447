"""The README's command lines run as shown: every ``autoplan ...`` line goes through the CLI's
own parser and runs to the exit code the README gives (a tiny run file where it plans)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.tools.cli import _parser, main
from tests.helpers.paths import REPO
from tests.helpers.readme import README, command_lines

TINY = str(REPO / "configs" / "tiny.yaml")


PARAM = "layers.0.attention.wq.weight"


def _expected_exit(line: str) -> int:
    """0, or the code a trailing ``# exits N`` comment gives."""
    found = re.search(r"#.*\bexits (\d+)", line)
    return int(found.group(1)) if found else 0


def _argvs(line: str, tmp: Path, saved: str) -> list[list[str]]:
    """The argument lists ``line`` stands for: optional ``[...]`` parts all given, each
    ``a|b`` alternative once, placeholders and planning run files made tiny."""
    words = shlex.split(line.split("#")[0])[1:]
    verb = words[0]
    words = [w.strip("[]") for w in words]
    out = []
    for w in words:
        if w == "NODE|PARAM":
            w = PARAM
        elif w in ("RUN.yaml",) or (w.startswith("configs/") and "topology" not in w):
            w = TINY
        elif w == "DIR_OR_FILE":
            w = str(tmp / "compare-out")
        elif w.endswith(".json"):
            w = str(tmp / w) if verb == "plan" else saved  # plan writes it, others read one
        elif w == "k=v":
            w = "plan.solver=cbc"  # a no-op override, so that explain's plan still matches
        out.append(w)
    variants = [[]]
    for w in out:
        options = w.split("|") if "|" in w and not w.startswith("-") else [w]
        variants = [v + [o] for v in variants for o in options]
    return variants


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A plan of the tiny run file, saved: what the README's diff and explain lines read."""
    path = str(tmp_path_factory.mktemp("saved") / "saved.json")
    assert main(["plan", TINY, "--out", path, "--quiet"]) == 0
    return path


@pytest.mark.parametrize("line", command_lines(README))
def test_each_readme_command_line_runs_as_shown(line, saved, tmp_path, capsys):
    """Each README command line, placeholders filled in, parses and exits as the README says."""
    capsys.readouterr()
    for argv in _argvs(line, tmp_path, saved):
        _parser().parse_args(argv)  # a flag the parser lacks exits here, naming it
        code, err = main(argv), capsys.readouterr().err
        assert code == _expected_exit(line), (argv, err[-2000:])
        if "--quiet" in argv:  # no phase lines: the README says --quiet turns them off
            assert not any(row.split()[:1] == ["trace"] for row in err.splitlines()), err


def test_compare_quiet_prints_no_progress(capsys):
    """compare --quiet (without --json, which is quiet anyway) keeps stderr free of phase
    lines, as plan --quiet does."""
    assert main(["compare", TINY, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "einsum" in captured.out


def _python_example(text: str) -> str:
    """The README's first Python block: the plan -> parallelize -> training step example."""
    return re.search(r"^```python\n(.*?)^```", text, flags=re.M | re.S).group(1)


def test_the_python_example_trains_a_step_under_torchrun(tmp_path):
    """The README's Python example runs as written under ``torchrun --nproc-per-node 4`` on
    CPU and ends cleanly (exit 0 on every rank, no abort at teardown)."""
    script = tmp_path / "example.py"
    script.write_text(_python_example(README))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", str(script)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
