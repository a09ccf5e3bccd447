"""Operands of the calibration's pointwise ops: read from memory, not from a warm cache
(autoplan.calibrate.compute)."""

from __future__ import annotations

import pytest
import torch

from autoplan.calibrate.compute import _MAX_PAIRS, _cold_pairs, _cycling
from autoplan.calibrate.sync import SyncSample, fit_sync


def test_operand_pairs_lie_side_by_side_in_the_pool_without_overlap():
    """Each pair is two distinct runs of numel elements of the pool; no element is in two
    operands; a small op gets at most _MAX_PAIRS pairs."""
    pool = torch.arange(1000.0)
    pairs = _cold_pairs(pool, 100)
    assert len(pairs) == 5
    firsts = sorted(float(t[0]) for pair in pairs for t in pair)
    assert firsts == [100.0 * k for k in range(10)]
    assert all(t.numel() == 100 and t.data_ptr() >= pool.data_ptr() for p in pairs for t in p)
    assert len(_cold_pairs(torch.zeros(4 * _MAX_PAIRS + 8), 1)) == _MAX_PAIRS


def test_a_pool_too_small_for_two_operands_gives_one_pair_of_its_own():
    """An op larger than half the pool still runs, on a pair of its own."""
    ((a, b),) = _cold_pairs(torch.zeros(10), 8)
    assert a.numel() == b.numel() == 8


def test_each_call_takes_the_next_pair_round_the_list():
    """The cycling op reads pair 0, 1, 2, 0, ..."""
    pairs = [(torch.tensor([float(k)]), torch.tensor([1.0])) for k in range(3)]
    run = _cycling(torch.add, pairs)
    assert [float(run()[0]) for _ in range(4)] == [1.0, 2.0, 3.0, 1.0]


def test_the_arrival_wait_is_what_the_collective_adds_after_compute_never_below_zero():
    """penalty = (burst then collective) - burst - collective alone, floored at 0."""
    assert SyncSample("dp", 800.0, 1800.0, 3400.0).penalty_us == 800.0
    assert SyncSample("dp", 800.0, 1800.0, 2000.0).penalty_us == 0.0


def _after(burst_us: float, penalty_us: float) -> SyncSample:
    return SyncSample("dp", burst_us, 1000.0, burst_us + 1000.0 + penalty_us)


def test_the_sync_fit_recovers_the_wait_and_its_growth_with_compute():
    """Penalties of 500 us + 0.1 x burst come back as sync_us 500 and skew 0.1, and a
    descheduled sample (a penalty 10x its line) moves neither (Theil-Sen's medians)."""
    bursts = [1000.0, 4000.0, 16000.0] * 3
    exact = [_after(b, 500.0 + 0.1 * b) for b in bursts]
    assert fit_sync(exact) == pytest.approx((500.0, 0.1))
    noisy = exact[:-1] + [_after(16000.0, 10 * (500.0 + 1600.0))]
    sync_us, skew = fit_sync(noisy)
    assert sync_us == pytest.approx(500.0, rel=0.05) and skew == pytest.approx(0.1, rel=0.05)


def test_the_sync_fit_never_goes_below_zero():
    """Penalties that fall with compute give no negative skew: their median, skew 0; one
    burst length gives the median penalty."""
    assert fit_sync([_after(b, 3000.0 - 0.1 * b) for b in (1000.0, 4000.0, 16000.0)]) == (
        pytest.approx(2600.0),
        0.0,
    )
    assert fit_sync([_after(1000.0, p) for p in (100.0, 300.0, 200.0)]) == (200.0, 0.0)
