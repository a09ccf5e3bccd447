"""Placement printing and parsing in DTensor's short form: one grammar, fmt and parse inverse."""

from __future__ import annotations

import itertools

import pytest
import torch

from autoplan.core.placements import REDUCE_OPS, fmt, is_even, local_shape, parse
from autoplan.core.torch_adapter import (
    Partial,
    Replicate,
    Shard,
    _StridedShard,
    is_masked_partial,
    masked_partial,
    masked_partial_key,
)

# Every kind of placement the planner can produce, one entry each (and a few dims).
EVERY_PLACEMENT = (
    Replicate(),
    *(Shard(d) for d in (0, 1, 3, 12)),
    *(_StridedShard(d, split_factor=k) for d, k in ((0, 1), (1, 2), (2, 4), (10, 16))),
    *(Partial(op) for op in REDUCE_OPS),
    masked_partial("sum", torch.Size([128, 64]), 0),
    masked_partial("sum", torch.Size([128256, 4096]), 1),
    masked_partial("sum", None, 0),
)


def _key(placements):
    """``placements`` comparable by value (a masked partial's == is by mask-buffer identity)."""
    return tuple(
        ("mask", *masked_partial_key(p)) if is_masked_partial(p) else (type(p), p)
        for p in placements
    )


def test_short_form_round_trips():
    """fmt and parse are inverse on S, _S, R and P."""
    p = (Shard(0), _StridedShard(1, split_factor=2), Replicate(), Partial())
    assert fmt(p) == "S(0)_S(1,2)RP"
    assert parse(fmt(p)) == p
    assert parse("S(0), R") == (Shard(0), Replicate())


def test_reduce_ops_are_dtensors():
    """The grammar's partial reductions include every one DTensor's Partial lists."""
    assert set(Partial.ALL_REDUCE_OPS) <= set(REDUCE_OPS)


@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_parse_inverts_fmt_on_every_placement(num_axes):
    """parse(fmt(p)) == p (masked partials by value) and fmt(parse(fmt(p))) == fmt(p) for
    every tuple of placements the planner can produce, on 1 to 3 mesh axes."""
    for combo in itertools.product(EVERY_PLACEMENT, repeat=num_axes):
        text = fmt(combo)
        back = parse(text, num_axes)
        assert _key(back) == _key(combo), text
        assert fmt(back) == text
        assert [type(p) for p in back] == [type(p) for p in combo], text


def test_partials_print_apart():
    """A sum partial prints P, every other reduction P(op), a masked partial MaskP(...): no
    two placements print alike."""
    texts = [fmt((p,)) for p in EVERY_PLACEMENT]
    assert len(set(texts)) == len(texts)
    assert fmt((Partial("avg"), Shard(1))) == "P(avg)S(1)"
    assert fmt((masked_partial("sum", torch.Size([128, 64]), 0),)) == "MaskP(sum,[128,64],0)"
    assert parse("P(avg)S(1)") == (Partial("avg"), Shard(1))


def test_parse_takes_spaces_and_commas():
    """People write placements with spaces and commas between axes (DTensor's own print)."""
    want = (Partial("max"), _StridedShard(0, split_factor=2), Replicate())
    assert parse(" P( max ), _S(0, 2) ,R ") == want
    masked = parse("MaskP(sum, [128, 64], 0) R")
    assert _key(masked) == _key((masked_partial("sum", torch.Size([128, 64]), 0), Replicate()))


@pytest.mark.parametrize("bad", ["X", "S(a)", "S0", "", "P(foo)", "P()", "MaskP(sum)", "SR(0)"])
def test_parse_rejects_garbage_with_the_allowed_forms(bad):
    """A placement that does not parse names the text and the allowed forms."""
    with pytest.raises(ValueError, match="S\\(d\\)"):
        parse(bad)


def test_a_sum_partial_has_one_spelling():
    """P(sum) is refused with the spelling to use (P), so every placement has one text."""
    with pytest.raises(ValueError, match="write P"):
        parse("P(sum)R")


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
