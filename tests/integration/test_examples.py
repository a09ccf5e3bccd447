"""The examples users copy from run as documented and show what the README says they show."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO

STEP = re.compile(
    r"^step (\d+)\s+loss (\S+)\s+one device (\S+)\s+diff (\S+)\s+collectives (\{.*\})$", re.M
)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run an example as a user would; it imports this checkout's autoplan."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_train_tiny_under_torchrun_matches_one_device_and_the_priced_collectives():
    """`torchrun --nproc-per-node 4 examples/train_tiny.py`: 5 steps equal one device, collectives as priced."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    done = _run([*cmd, str(REPO / "examples" / "train_tiny.py")], REPO)
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
    done = _run([sys.executable, str(REPO / "examples" / "plan_llama3.py")], tmp_path)
    assert "estimated step" in done.stdout
    saved = json.loads((tmp_path / "llama3_8b_2l.plan.json").read_text())
    assert saved["status"] == "optimal"
    assert saved["mesh_shape"] == [8, 8]
    assert len((REPO / "examples" / "plan_llama3.py").read_text().splitlines()) <= 30


def test_plan_moves_script_runs_every_move_of_a_tiny_native_plan_as_priced():
    """`python scripts/plan_moves.py configs/tiny.yaml --set plan.mm_mode=native --all`: every move as priced, right shards."""
    cmd = [sys.executable, str(REPO / "scripts" / "plan_moves.py"), "configs/tiny.yaml"]
    done = _run([*cmd, "--set", "plan.mm_mode=native", "--all"], REPO)
    moves = re.findall(r"^\s+\d+ edges\s+(\S+) -> (\S+) on .*: (.*)$", done.stdout, re.M)
    assert moves, done.stdout
    assert all(result == "as priced; right shards" for *_, result in moves), done.stdout


LM_STEP = re.compile(
    r"^step\s+(\d+)\s+loss (\S+)\s+lr \S+(?:\s+one device (\S+)\s+diff \S+)?$", re.M
)


def _train_lm(tmp_path: Path, *args: str) -> tuple[str, dict[int, tuple[float, float | None]]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    short = ["--steps", "6", "--checkpoint-at", "3", "--seq", "32", "--warmup", "3"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    done = _run([*cmd, str(REPO / "examples" / "train_lm.py"), *short, *ckpt, *args], tmp_path)
    steps = {
        int(s): (float(loss), float(ref) if ref else None)
        for s, loss, ref in LM_STEP.findall(done.stdout)
    }
    return done.stdout, steps


def test_train_lm_equals_one_device_and_resumes_under_another_plan(tmp_path):
    """`examples/train_lm.py` in short: the first steps equal one device; resumed from its
    midway checkpoint under a budgeted plan (other placements), the same losses follow."""
    full_out, full = _train_lm(tmp_path, "--compare-steps", "6")
    assert sorted(full) == list(range(6)), full_out
    for loss, ref in full.values():
        assert ref is not None and abs(loss - ref) <= 1e-4 * abs(ref), full_out
    resumed_out, resumed = _train_lm(tmp_path, "--resume", "--memory-budget-gib", "0.001")
    assert "resumed at step 3" in resumed_out, resumed_out
    plans = re.findall(r"^plan: optimal, parameter placements (.*)$", full_out + resumed_out, re.M)
    assert len(plans) == 2 and plans[0] != plans[1], plans
    assert sorted(resumed) == [3, 4, 5], resumed_out
    for step, (loss, _) in resumed.items():
        assert abs(loss - full[step][0]) <= 1e-4 * abs(full[step][0]), (step, loss, full[step])
