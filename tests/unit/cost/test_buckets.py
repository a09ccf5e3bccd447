"""Buckets: the grouping rule the plan prices and lowering runs (autoplan.cost.buckets).

Execution of bucketed steps (all_reduce, all_gather and reduce_scatter buckets) equal to
one device is checked in tests/integration/test_apply.py's gloo cases, which also assert
that the buckets a run makes are the ones its plan lists.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import fx

from autoplan.core.topology import Device
from autoplan.cost.buckets import bucket_groups, copies_us, op_name
from autoplan.cost.compute import ComputeModel
from autoplan.runtime.bucket_program import bucket_collectives


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


# a copy or an allocation costs 1000 us, a view 1 us, bytes nothing
_COUNTING = ComputeModel(Device("counting", 1.0, 1.0, 1e12, 1.0, 1.0, 1.0, 1000.0, 1.0, 1.0), (4,))
_C10D = torch.ops._c10d_functional
_COPIES = {"bucket_fill", "cat", "clone", "new_empty"}
_VIEWS = {"view", "reshape", "slice"}


def _program(kind: str, shapes: list[tuple[int, ...]], where: str) -> tuple[fx.Graph, list[str]]:
    """Collectives of ``kind`` on 4 ranks, one per input: a backward's tail (their
    results returned) or a forward's head (on the parameters, results read by compute)."""
    g, outs, names = fx.Graph(), [], []
    for i, shape in enumerate(shapes):
        x = g.placeholder(f"p{i}")
        x.meta["val"] = torch.empty(shape)
        names.append(x.name)
        if where == "tail":
            x = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
            x.meta["val"] = torch.empty(shape)
        args = {
            "all_reduce": (_C10D.all_reduce.default, (x, "sum", "0")),
            "all_gather": (_C10D.all_gather_into_tensor.default, (x, 4, "0")),
            "reduce_scatter": (_C10D.reduce_scatter_tensor.default, (x, "sum", 4, "0")),
        }[kind]
        out = (shape[0] * 4, *shape[1:]) if kind == "all_gather" else shape
        out = (shape[0] // 4, *shape[1:]) if kind == "reduce_scatter" else out
        waited = g.call_function(_C10D.wait_tensor.default, (g.call_function(*args),))
        waited.meta["val"] = torch.empty(out)
        if where == "head":
            waited = g.call_function(torch.ops.aten.mul.Tensor, (waited, 2.0))
        outs.append(waited)
    g.output(tuple(outs))
    return g, names


@pytest.mark.parametrize(
    "kind, where",
    [("all_reduce", "tail"), ("reduce_scatter", "tail"), ("all_gather", "tail"),
     ("all_gather", "head"), ("all_reduce", "head")],
)  # fmt: skip
def test_a_buckets_copies_are_priced_as_the_lowered_program_runs_them(kind, where):
    """copies_us counts the copies, allocations and views the bucket rewrite adds (a fill
    is a reshape, a view, a slice and a copy), for every kind and place."""
    shapes = [(8, 3), (4,), (12, 2)]
    g, names = _program(kind, shapes, where)
    before = [op_name(n.target) for n in g.nodes if n.op == "call_function"]
    (bucket,) = bucket_collectives(g, 1 << 20, head_from=names if where == "head" else (),
                                   tail=where == "tail")  # fmt: skip
    assert bucket.members == 3
    added = [op_name(n.target) for n in g.nodes if n.op == "call_function"]
    for name in before:
        added.remove(name) if name in added else None
    copies = sum(n in _COPIES for n in added)
    views = sum(n in _VIEWS for n in added) + 3 * added.count("bucket_fill")
    assert set(added) <= _COPIES | _VIEWS | {"all_reduce_"}  # nothing unpriced
    sizes = [4 * math.prod(s) for s in shapes]
    ins = sizes
    outs = [b * 4 if kind == "all_gather" else b // 4 if kind == "reduce_scatter" else b
            for b in sizes]  # fmt: skip
    priced = copies_us(where, kind, ins, outs, _COUNTING)
    assert priced == pytest.approx(1000 * copies + views)
