"""Buckets: the grouping rule the plan prices and lowering runs (autoplan.cost.buckets).

Execution of bucketed steps (all_reduce, all_gather and reduce_scatter buckets) equal to
one device is checked in tests/integration/test_apply.py's gloo cases, which also assert
that the buckets a run makes are the ones its plan lists.
"""

from __future__ import annotations

from autoplan.cost.buckets import bucket_groups


def test_buckets_fill_up_to_the_cap_per_key_in_issue_order():
    """Same-key items merge until the next would pass the cap; other keys never mix."""
    keys = ["ar", "ar", "ag", "ar", "ar"]
    groups = bucket_groups(keys, [4, 4, 4, 4, 4], [0] * 5, cap=8)
    assert groups == [[0, 1], [2], [3, 4]]


def test_an_item_larger_than_the_cap_stays_alone():
    groups = bucket_groups(["ar"] * 3, [2, 100, 2], [0] * 3, cap=10)
    assert groups == [[0], [1], [2]]


def test_an_item_reading_an_open_bucket_closes_it_first():
    """Item 2 reads item 1's result (bit 1): merging them would make a cycle."""
    groups = bucket_groups(["ar"] * 4, [1] * 4, [0, 0, 0b10, 0], cap=100)
    assert groups == [[0, 1], [2, 3]]


def test_a_dependency_on_another_keys_bucket_closes_that_one():
    """Item 2 (key b) reads item 0 (key a): a's bucket closes, b's stays open."""
    groups = bucket_groups(["a", "b", "b", "a"], [1] * 4, [0, 0, 0b01, 0], cap=100)
    assert groups == [[0], [1, 2], [3]]
