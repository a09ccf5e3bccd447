"""Tests for autoplan.ilp.formulation.matrix and autoplan.ilp.backends: the arrays both
solvers read."""

from __future__ import annotations

import time

from tests.helpers.ilp_problems import ilp_model, random_problem


def test_cbc_overrunning_its_time_limit_is_stopped(monkeypatch, tmp_path):
    """A CBC that ignores -sec (it can, after a timed-out -dualS) is stopped past the limit
    and its grace, and the run reports no solution instead of hanging the planner."""
    from autoplan.ilp import backends

    slow = tmp_path / "cbc"
    slow.write_text("#!/bin/sh\nsleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setattr(backends, "cbc_path", lambda: str(slow))
    monkeypatch.setattr(backends, "_GRACE_S", 0.5)
    p = random_problem(0)
    began = time.perf_counter()
    result = backends.run(
        ilp_model(p).emitted.matrix, "cbc", mip=True, time_limit_s=0.2, mip_gap=0.0
    )
    assert result.status == "stopped" and result.x is None
    assert time.perf_counter() - began < 10
