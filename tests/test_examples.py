"""The examples users copy from run as documented and show what the README says they show."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(
    r"^step (\d+)\s+loss (\S+)\s+one device (\S+)\s+diff (\S+)\s+collectives (\{.*\})$", re.M
)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run an example as a user would; it imports this checkout's autoplan."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_train_tiny_under_torchrun_matches_one_device_and_the_priced_collectives():
    """`torchrun --nproc-per-node 4 examples/train_tiny.py`: 5 steps equal one device, collectives as priced."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    done = _run([*cmd, str(ROOT / "examples" / "train_tiny.py")], ROOT)
    steps = STEP.findall(done.stdout)
    assert [int(s[0]) for s in steps] == [0, 1, 2, 3, 4], done.stdout
    for _, loss, ref, _, _ in steps:
        assert abs(float(loss) - float(ref)) <= 1e-5 + 1e-4 * abs(float(ref))
    priced = re.search(r"^priced by the plan: (\{.*\})$", done.stdout, re.M)
    assert priced is not None, done.stdout
    expected = ast.literal_eval(priced.group(1))
    assert expected, "the budgeted plan must communicate"
    for step in steps:
        assert ast.literal_eval(step[4]) == expected


def test_plan_llama3_example_prints_and_saves_a_plan(tmp_path):
    """`python examples/plan_llama3.py` prints an optimal 8B plan and writes its JSON."""
    done = _run([sys.executable, str(ROOT / "examples" / "plan_llama3.py")], tmp_path)
    assert "estimated step" in done.stdout
    saved = json.loads((tmp_path / "llama3_8b_2l.plan.json").read_text())
    assert saved["status"] == "optimal"
    assert saved["mesh_shape"] == [8, 8]
    assert len((ROOT / "examples" / "plan_llama3.py").read_text().splitlines()) <= 30


def test_plan_moves_script_runs_every_move_of_a_tiny_native_plan_as_priced():
    """`python scripts/plan_moves.py configs/tiny.yaml --set plan.mm_mode=native --all`: every move as priced, right shards."""
    cmd = [sys.executable, str(ROOT / "scripts" / "plan_moves.py"), "configs/tiny.yaml"]
    done = _run([*cmd, "--set", "plan.mm_mode=native", "--all"], ROOT)
    moves = re.findall(r"^\s+\d+ edges\s+(\S+) -> (\S+) on .*: (.*)$", done.stdout, re.M)
    assert moves, done.stdout
    assert all(result == "as priced; right shards" for *_, result in moves), done.stdout
