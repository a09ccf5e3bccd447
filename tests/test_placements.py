"""Placement printing and parsing in DTensor's short form."""

from __future__ import annotations

import pytest

from autoplan.placements import fmt, is_even, local_shape, parse
from autoplan.strategies.dtensor import Partial, Replicate, Shard, _StridedShard


def test_short_form_round_trips():
    """fmt and parse are inverse on S, _S, R and P."""
    p = (Shard(0), _StridedShard(1, split_factor=2), Replicate(), Partial())
    assert fmt(p) == "S(0)_S(1,2)RP"
    assert parse(fmt(p)) == p
    assert parse("S(0), R") == (Shard(0), Replicate())


@pytest.mark.parametrize("bad", ["X", "S(a)", "S0", ""])
def test_parse_rejects_garbage_with_the_allowed_forms(bad):
    """A placement that does not parse names the text and the allowed forms."""
    with pytest.raises(ValueError, match="S\\(d\\)"):
        parse(bad)


def test_parse_checks_axis_count():
    """One placement per mesh axis is required."""
    with pytest.raises(ValueError, match="2 axes"):
        parse("S(0)", 2)


def test_strided_shard_counts_as_sharded():
    """_StridedShard splits its dim like Shard for local shapes and evenness."""
    mesh = (2, 4)
    assert local_shape((16, 8), (_StridedShard(0, split_factor=2), Shard(0)), mesh) == (2, 8)
    assert not is_even((6, 8), (Shard(0), Shard(0)), mesh)
    assert is_even((8, 8), (Shard(0), Shard(1)), mesh)
