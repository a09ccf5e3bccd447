"""`autoplan calibrate` refuses, before it makes any process group, a job it cannot
measure: each message names the option, its value and the fix, and the exit code is 2
(autoplan.calibrate.command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.tools.runfile import load_topology
from tests.helpers.paths import REPO


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node 4 --no-python autoplan calibrate ...` on this checkout."""
    autoplan_script = Path(sys.executable).parent / "autoplan"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "4", "--no-python", str(autoplan_script), "calibrate", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_the_command_as_the_readme_spells_it(tmp_path):
    """The full calibration under torchrun, --quiet: the file loads, the table is printed
    once (rank 0) and no phase line; run again, the existing file is refused by rank 0
    alone, and kept."""
    args = ["--mesh", "2x2", "--names", "dp,tp", "--out", "cpu.yaml"]
    done = _torchrun(tmp_path, *args, "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    topology = load_topology(str(tmp_path / "cpu.yaml"))
    assert topology.calibration.mesh == (2, 2) and topology.gpus_per_node == 4
    assert done.stdout.count("intra.all_reduce") == 1
    assert "topology written to cpu.yaml" in done.stdout
    assert "comm dp" not in done.stderr
    text = (tmp_path / "cpu.yaml").read_text()
    again = _torchrun(tmp_path, *args)
    assert again.returncode != 0
    assert again.stderr.count("--out cpu.yaml: the file exists") == 1, again.stderr[-3000:]
    assert (tmp_path / "cpu.yaml").read_text() == text
