"""Progress of a planning run on the terminal: one line per finished phase.

Input: the phase names the planner announces as each phase starts (its
``progress`` callback). Output, on stderr: a spinner with the running phase
and its elapsed seconds while it runs (on a terminal), then a line per phase
with its wall time, so a user planning a 70B model sees where the minutes go.

Why rich: it degrades to plain lines when stderr is a file or a pipe (CI
logs), and draws a live spinner only on a terminal.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.status import Status


class PhaseProgress:
    """Callable progress reporter; use as a context manager around the planning call."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.title = title
        self.phase: str | None = None
        self.start = 0.0
        self.status: Status | None = None

    def __enter__(self) -> PhaseProgress:
        self.console.print(f"[bold]autoplan[/bold] {self.title}")
        return self

    def __call__(self, phase: str) -> None:
        self._finish()
        self.phase, self.start = phase, time.perf_counter()
        if self.console.is_terminal:
            self.status = self.console.status(f"{phase} ...", spinner="dots")
            self.status.start()

    def _finish(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        if self.phase is not None:
            seconds = time.perf_counter() - self.start
            self.console.print(f"  {self.phase:<11} {seconds:7.2f} s")
            self.phase = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._finish()
            return
        if self.status is not None:
            self.status.stop()
        if self.phase is not None:
            self.console.print(f"  {self.phase:<11} stopped: {exc_type.__name__}")
