"""Running a snippet in a fresh interpreter, for checks that one process's imports or
process groups must not leak into (what earlier tests imported is already registered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from tests.helpers.paths import REPO


def run_isolated(code: str) -> Any:
    """Run ``code`` in a new Python process on this checkout; the JSON it prints last."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
