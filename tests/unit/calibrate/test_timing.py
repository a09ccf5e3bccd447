"""How a compute repeat's calls make its time, alone or in a rotation
(autoplan.calibrate.timing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.calibrate import timing
from autoplan.calibrate.timing import middle_mean, share_turns


def test_the_calls_that_waited_for_a_core_count_in_the_mean():
    """Four ranks on two cores: a short call mostly runs whole or waits whole. Every
    second call here waited 3 us for a core; the repeat's time holds half of that wait,
    as a step that runs such ops one after another spends it (the median call, 1 us,
    would not)."""
    calls = [1.0, 4.0] * 8
    assert middle_mean(calls) == pytest.approx(2.5)


def test_the_first_and_last_quarters_are_dropped():
    """In the first and last calls some ranks run alone, left behind at the barrier."""
    calls = [0.1] * 4 + [2.0] * 8 + [0.1] * 4
    assert middle_mean(calls) == pytest.approx(2.0)


def test_a_rotation_calls_its_runs_in_turn_and_times_each_on_its_own_calls(monkeypatch):
    """A program calls many ops in turn, so the rotation does: the first run, the second,
    the first again; each run gets its share of the turns' time."""
    now = [0.0]
    order: list[str] = []

    def run(name: str, seconds: float):
        def call() -> None:
            order.append(name)
            now[0] += seconds

        return call

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    clock = timing.Clock(torch.device("cpu"))
    took = clock._repeat((run("mm", 3.0), run("view", 1.0)), inner=8)
    assert order == ["mm", "view"] * 8
    assert took == [pytest.approx(3.0), pytest.approx(1.0)]


def test_a_single_run_of_few_calls_is_timed_whole(monkeypatch):
    """Under 8 calls a middle half says little: the repeat's time over its calls."""
    now = [0.0]

    def call() -> None:
        now[0] += 2.0

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    assert timing.Clock(torch.device("cpu"))._repeat((call,), inner=4) == [pytest.approx(2.0)]


def test_a_wait_for_a_core_is_shared_over_the_runs_in_proportion_to_their_length():
    """A rank waits for a core at any instant, so a wait falls on a run in proportion to
    its length: here one view call waited 40 s; the turns' mean holds it, and the
    matmul, three times the view's median call, takes three quarters of it."""
    calls = np.array([[3.0, 1.0]] * 8)
    calls[3, 1] += 40.0
    assert share_turns(calls) == [pytest.approx(10.5), pytest.approx(3.5)]
