"""Operands of the calibration's pointwise ops: read from memory, not from a warm cache
(autoplan.calibrate.compute)."""

from __future__ import annotations

import torch

from autoplan.calibrate.compute import _MAX_PAIRS, _cold_pairs, _cycling
from autoplan.calibrate.sync import SyncSample


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
