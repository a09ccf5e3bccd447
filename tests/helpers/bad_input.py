"""Shared helpers for the bad-input tests: run the CLI in process, check an error is clear.

A clear error, as issue "No traceback, no silent acceptance" asks: the documented exit
code, no traceback anywhere in the output, and the words that name the thing and the fix.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import pytest

from autoplan.tools.cli import main


@dataclass(frozen=True)
class Ran:
    """One CLI call: its exit code and what it printed."""

    code: int
    out: str
    err: str


def cli(*argv: str) -> Ran:
    """``autoplan *argv`` in this process; stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors exit 2 themselves
            code = int(exc.code or 0)
    return Ran(code, out.getvalue(), err.getvalue())


def assert_clear(ran: Ran, code: int, *words: str) -> None:
    """``ran`` exited with ``code``, printed no traceback, and its stderr holds every word."""
    text = ran.out + ran.err
    assert "Traceback" not in text, text
    assert ran.code == code, f"exit {ran.code}, wanted {code}: {text}"
    missing = [w for w in words if w.lower() not in ran.err.lower()]
    assert not missing, f"stderr lacks {missing}: {ran.err}"


def assert_plan_error(call, *words: str) -> None:
    """``call()`` raises a PlanError whose message holds every word (case-insensitive)."""
    from autoplan.core.errors import PlanError

    with pytest.raises(PlanError) as info:
        call()
    message = str(info.value).lower()
    missing = [w for w in words if w.lower() not in message]
    assert not missing, f"message lacks {missing}: {info.value}"
