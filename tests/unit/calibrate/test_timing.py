"""How a compute repeat's calls make its time (autoplan.calibrate.timing)."""

from __future__ import annotations

import pytest

from autoplan.calibrate.timing import middle_mean


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
