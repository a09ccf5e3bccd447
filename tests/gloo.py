"""Helpers for the tests that run a plan on several gloo processes (``mp.spawn``)."""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    """A TCP port nothing listens on now, for the process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_worker() -> None:
    """End a spawned worker that finished its work and destroyed its process group.

    Without this, the interpreter's teardown sometimes aborts the process (``terminate
    called without an active exception``, SIGABRT) after every check passed and the
    results were written: gloo's threads still hold work with tensors when the
    interpreter goes away (pytorch/pytorch#179291 describes it). In this suite it hit 2
    of 9 runs of tests/test_apply.py in one afternoon. A worker that raised still exits
    through ``mp.spawn``'s own path, which reports the error.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
