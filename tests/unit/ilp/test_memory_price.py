"""The multiplier search's root steps (autoplan.ilp.bound.memory_price.find_root)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.ilp.bound.memory_price import find_root


def _noisy(root: float, slope: float, amp: float, seed: int):
    """g decreasing through ``root``, read with noise that is a fixed function of λ (the
    search's g is read on messages converged to a tolerance, the same at the same λ)."""
    rng = np.random.default_rng(seed)
    knots = np.linspace(0.0, 4.0 * root, 64)
    bumps = amp * rng.uniform(-1.0, 1.0, len(knots))

    def g(lam: float) -> float:
        return slope * (root - lam) + float(np.interp(lam, knots, bumps))

    return g


@pytest.mark.parametrize("seed", range(40))
def test_no_step_goes_back_past_a_sign_already_seen(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    root = float(rng.uniform(1.0, 50.0))
    g = _noisy(
        root, slope=float(rng.uniform(0.05, 1.0)), amp=float(rng.uniform(0.0, 0.5)), seed=seed
    )
    seen: list[tuple[float, float]] = []

    def read(lam: float) -> float:
        value = g(lam)
        seen.append((lam, value))
        return value

    find_root(read, g(0.0), stop=lambda: False)
    assert seen, "the search reads g at least once"
    for k, (lam, _) in enumerate(seen):
        below = [x for x, v in seen[:k] if v > 0]
        above = [x for x, v in seen[:k] if v < 0]
        assert not below or lam > max(below), (seen, k)
        assert not above or lam < min(above), (seen, k)


def test_a_bump_after_two_steps_does_not_send_the_search_back_to_zero() -> None:
    # the steps of LLaMA3-405B's search, in shape: positive and falling, then a reading
    # above the last one, whose secant points below zero
    table = {1.41: 1.2, 7.05: 0.347, 9.345: 0.4}

    def g(lam: float) -> float:
        for x, v in table.items():
            if abs(lam - x) < 1e-2:
                return v
        return 0.1 * (12.5 - lam)

    seen: list[float] = []

    def read(lam: float) -> float:
        seen.append(lam)
        return g(lam)

    find_root(read, 1.41, stop=lambda: False)
    assert seen[:3] == pytest.approx([1.41, 7.05, 9.345], abs=1e-3)
    assert min(seen[3:]) > 9.345
    assert abs(g(seen[-1])) <= 0.02 * seen[-1]


def test_stop_ends_the_search() -> None:
    seen: list[float] = []

    def read(lam: float) -> float:
        seen.append(lam)
        return 10.0 - lam * 0.01

    find_root(read, 10.0, stop=lambda: len(seen) >= 2)
    assert len(seen) == 2
