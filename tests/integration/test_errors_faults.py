"""Faults while planning: signals, a solver that hangs or fails, a disk that fills.

Each ends with the documented exit code and one line on stderr, no traceback, and
nothing left behind: no solver child running, no temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoplan.ilp import backends
from tests.helpers.bad_input import assert_clear, cli
from tests.helpers.paths import REPO
from tests.helpers.runs import TINY_RUN

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _run_file(tmp_path: Path) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(TINY_RUN)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(autouse=True)
def _ctrl_c_handled():
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal's foreground job:
    a shell starts a background job (`make test &`, a CI runner's) with SIGINT ignored,
    which Python and every child then keep, and the Ctrl-C tests would test nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)


@pytest.fixture
def hanging_cbc(tmp_path, monkeypatch):
    """CBC replaced by a script that records its pid and sleeps; temporary files under tmp_path."""
    pid_file = tmp_path / "cbc.pid"
    script = tmp_path / "cbc"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    script.chmod(0o755)
    monkeypatch.setattr(backends, "cbc_path", lambda: str(script))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    return pid_file, tmp


def _signal_when_started(pid_file: Path, signum: int) -> threading.Thread:
    """Send ``signum`` to this process once the fake solver has written its pid."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            pid_file.exists() and pid_file.read_text().strip()
        ):
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("signum", "code", "words"),
    [
        (signal.SIGTERM, 143, ("stopped by SIGTERM",)),
        (signal.SIGINT, 130, ("interrupted",)),
        (signal.SIGHUP, 129, ("stopped by SIGHUP",)),
    ],
)
def test_signal_during_solve_stops_solver_and_cleans_up(tmp_path, hanging_cbc, signum, code, words):
    """A signal while CBC runs: exit 128+signal, one line, the child killed, its files gone."""
    pid_file, tmp = hanging_cbc
    thread = _signal_when_started(pid_file, signum)
    ran = cli("plan", _run_file(tmp_path), "--quiet")
    thread.join(5)
    assert_clear(ran, code, *words)
    assert len(ran.err.strip().splitlines()) == 1
    assert not _alive(int(pid_file.read_text()))
    assert list(tmp.iterdir()) == []


def test_a_signal_another_thread_takes_still_stops_the_solve(tmp_path, hanging_cbc):
    """Ctrl-C taken by a thread other than the main one (the kernel's pick in a process
    with torch's or gloo's threads; forced here by blocking SIGINT in the main thread)
    stops the solve at once: exit 130, the child killed. The main thread waited on the
    child in one call, which only a signal delivered to it interrupts: the solve ran to
    its end (60 s here)."""
    pid_file, _ = hanging_cbc
    thread = _signal_when_started(pid_file, signal.SIGINT)  # started unblocked: it can take it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    began = time.monotonic()
    try:
        ran = cli("plan", _run_file(tmp_path), "--quiet")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    thread.join(5)
    assert time.monotonic() - began < 30
    assert_clear(ran, 130, "interrupted")
    assert not _alive(int(pid_file.read_text()))


def test_handlers_restored_after_a_command(tmp_path):
    """The CLI's signal handlers last only as long as the command."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    cli("validate", _run_file(tmp_path))
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_solver_past_time_limit_is_killed(tmp_path, hanging_cbc, monkeypatch):
    """A CBC that ignores its time limit is killed after the grace; the bound's plan is kept."""
    pid_file, tmp = hanging_cbc
    monkeypatch.setattr(backends, "_GRACE_S", 0.2)
    began = time.monotonic()
    ran = cli("plan", _run_file(tmp_path), "--quiet", "--set", "plan.time_limit_s=0.5")
    assert time.monotonic() - began < 30
    assert_clear(ran, 0)
    assert "time_limit" in ran.out and "Raise plan.time_limit_s" in ran.out
    assert not _alive(int(pid_file.read_text()))
    assert list(tmp.iterdir()) == []


def test_failing_solver_is_one_line_exit_3(tmp_path, monkeypatch):
    """A CBC that crashes is an internal error: exit 3, its last output, the --debug hint."""
    script = tmp_path / "cbc"
    script.write_text("#!/bin/sh\necho 'cbc: bad model' >&2\nexit 9\n")
    script.chmod(0o755)
    monkeypatch.setattr(backends, "cbc_path", lambda: str(script))
    ran = cli("plan", _run_file(tmp_path), "--quiet")
    assert_clear(ran, 3, "internal error", "exit code 9", "--debug")


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    """--debug (before or after the command) prints the internal error's traceback."""
    script = tmp_path / "cbc"
    script.write_text("#!/bin/sh\nexit 9\n")
    script.chmod(0o755)
    monkeypatch.setattr(backends, "cbc_path", lambda: str(script))
    for argv in (("--debug", "plan"), ("plan", "--debug")):
        ran = cli(*argv, _run_file(tmp_path), "--quiet")
        assert ran.code == 3 and "Traceback" in ran.err and "--debug for" not in ran.err


def test_full_disk_keeps_the_plan(tmp_path, monkeypatch):
    """--out onto a full disk: exit 2 and the plan saved to a temporary file it names."""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    ran = cli("plan", _run_file(tmp_path), "--quiet", "--out", "/dev/full")
    assert_clear(ran, 2, "no space left", "saved to")
    saved = list(tmp_path.glob("autoplan-plan-*.json"))
    assert len(saved) == 1 and '"param_placements"' in saved[0].read_text()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_real_process_interrupted_while_planning(tmp_path, signum, code):
    """``autoplan plan`` as its own process, signalled mid-plan: the exit code and one line."""
    path = _run_file(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoplan.tools.cli",
            "plan",
            path,
            "--set",
            "model.args.n_layers=8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert child.stderr is not None
    first = child.stderr.readline()  # the progress title: planning has begun
    assert "autoplan" in first, first
    child.send_signal(signum)
    out, err = child.communicate(timeout=60)
    assert "Traceback" not in err + out, err
    assert child.returncode == code, err
    assert err.strip().splitlines()[-1].startswith("autoplan: ")
    assert not list(tmp_path.glob("autoplan-cbc-*"))


def test_cbc_is_found_through_pulps_own_lookup():
    """The CBC binary is the one PuLP bundles for this platform, at the path PuLP builds."""
    from pulp.apis import coin_api

    assert backends.cbc_path() == os.path.realpath(coin_api.pulp_cbc_path)


def test_no_cbc_anywhere_is_bad_input_before_planning(tmp_path, monkeypatch):
    """No bundled CBC and none PuLP can find: exit 2 naming how to install one or use
    highs, before any tracing."""
    from pulp.apis import coin_api

    import autoplan.planner.front_end

    monkeypatch.setattr(coin_api, "pulp_cbc_path", str(tmp_path / "no-cbc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(
        autoplan.planner.front_end, "trace_joint", lambda *a, **k: pytest.fail("traced")
    )
    ran = cli("plan", _run_file(tmp_path), "--quiet")
    assert_clear(ran, 2, "solver 'cbc' needs a CBC binary", "pulp[cbc]", "solver: highs")


def test_a_signal_while_the_solver_starts_leaves_no_child(tmp_path, hanging_cbc, monkeypatch):
    """Ctrl-C landing inside Popen, after the fork and before Popen returns (a loaded
    machine schedules the main thread late), still kills and reaps the solver child."""
    pid_file, tmp = hanging_cbc
    start = subprocess.Popen._execute_child

    def started_then_interrupted(self, *args, **kwargs):
        start(self, *args, **kwargs)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pid_file.read_text().strip():
            time.sleep(0.02)  # the child runs: its pid file is written
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, still inside Popen

    pid_file.write_text("")
    monkeypatch.setattr(subprocess.Popen, "_execute_child", started_then_interrupted)
    ran = cli("plan", _run_file(tmp_path), "--quiet")
    assert_clear(ran, 130, "interrupted")
    assert not _alive(int(pid_file.read_text()))
    assert list(tmp.iterdir()) == []
