"""The solver binary run as a child process this process owns, for stage 5's CBC runs.

Input: a command line and how long to wait for it (seconds, or ``None``). Output: the
child's exit code and its combined stdout and stderr, or ``(None, "")`` once the wait
has run out. Why a module of its own: owning a child is a concern apart from writing
MPS files and reading solutions. The child must not outlive the solve on any way out
(the time limit, Ctrl-C, the CLI's SIGTERM or SIGHUP turned into an exception, one of
those landing while ``Popen`` starts it), so the interrupting signals are held while it
starts and the child is killed and reaped before this returns or raises.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

__all__ = ["run_owned"]

# Signals whose handlers may raise (Ctrl-C, and the CLI's SIGTERM and SIGHUP).
_INTERRUPTS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
_SLICE_S = 0.1  # the main thread wakes this often while it waits, to run a signal's handler


@contextlib.contextmanager
def _interrupts_held(held: list[int]) -> Iterator[None]:
    """Inside the block, the interrupting signals are recorded in ``held``, not handled;
    the previous handlers come back after it. A signal handled inside ``Popen`` would raise
    after the child started and before the caller owns it, and the child would outlive us.
    Only the main thread installs handlers, so elsewhere this holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in _INTERRUPTS
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _deliver(held: list[int]) -> None:
    """Raise the signals :func:`_interrupts_held` recorded, now handled as they came."""
    for signum in held:
        signal.raise_signal(signum)


def run_owned(args: list[str], wait: float | None) -> tuple[int | None, str]:
    """Run ``args`` to completion: (exit code, output), or (None, "") past ``wait`` s.

    The child is killed and reaped on every way out of here (the time limit, Ctrl-C, a
    signal the caller turned into an exception, one landing while the child starts), so
    no solver outlives the solve.
    """
    held: list[int] = []
    try:
        with _interrupts_held(held):
            child = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
    except BaseException:
        _deliver(held)  # an interruption outranks the failed start
        raise
    with child:
        try:
            _deliver(held)  # the child is owned now: the finally below stops it
            output = _output(child, wait)
            if output is None:
                return None, ""
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()  # reaped here: on Ctrl-C, Popen's own exit waits only briefly
        return child.returncode, output


def _output(child: subprocess.Popen[str], wait: float | None) -> str | None:
    """``child``'s output once it exits, or None past ``wait`` s. Waits in slices: the
    kernel may hand a process's signal to any of its threads (torch and gloo start some),
    and one taken by another thread does not interrupt the main thread's wait; Python runs
    the handler only when the main thread runs again."""
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        step = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
        try:
            output, _ = child.communicate(timeout=max(step, 0.0))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            continue
        return output
