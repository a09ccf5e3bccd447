"""Where the checkout's files are, for tests that read or run them: one place, so a test's
own depth under tests/ never enters a path."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
