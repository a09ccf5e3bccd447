"""Nothing in tests, scripts or examples hides an abort at the interpreter's teardown behind
``os._exit`` (autoplan.runtime.release); torchrun jobs exiting cleanly run in
tests/integration/test_exit.py."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.paths import REPO


def test_no_script_ends_its_processes_with_os_exit():
    """No os._exit in tests, scripts or examples: a process that ends must end cleanly."""
    pattern = re.compile(r"\bos\._exit\(")
    found = [
        str(path.relative_to(REPO))
        for folder in ("tests", "scripts", "examples")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != Path(__file__).resolve() and pattern.search(path.read_text())
    ]
    assert not found, found
