"""Buckets in lowered programs: the graph rewrite that merges collectives and lays their
inputs out (autoplan.runtime.bucket_program).

Execution of bucketed steps (all_reduce, all_gather and reduce_scatter buckets) equal to
one device is checked in tests/integration/test_apply.py's gloo cases, which also assert
that the buckets a run makes are the ones its plan lists.
"""

from __future__ import annotations

import torch
from torch import fx

from autoplan.runtime.bucket_program import bucket_collectives, bucket_fill

_C10D = torch.ops._c10d_functional


def _two_gradients() -> fx.Graph:
    """Two gradients, each all-reduced and returned: the tail of a backward program."""
    g = fx.Graph()
    outs = []
    for name, shape in (("a", (4, 3)), ("b", (5,))):
        x = g.placeholder(name)
        x.meta["val"] = torch.empty(shape)
        y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
        y.meta["val"] = torch.empty(shape)
        reduced = g.call_function(_C10D.all_reduce.default, (y, "sum", "0"))
        waited = g.call_function(_C10D.wait_tensor.default, (reduced,))
        waited.meta["val"] = torch.empty(shape)
        outs.append(waited)
    g.output(tuple(outs))
    return g


def test_tail_reductions_run_as_one_collective_sliced_back():
    """Two gradient all-reduces become one, in place on a flat buffer each input is
    copied into as soon as it is computed; each output is its slice, in its own shape."""
    g = _two_gradients()
    (bucket,) = bucket_collectives(g, 1 << 20, tail=True)
    assert (bucket.kind, bucket.where, bucket.members, bucket.nbytes) == (
        "all_reduce",
        "tail",
        2,
        (12 + 5) * 4,
    )
    ops = [n.target for n in g.nodes if n.op == "call_function"]
    assert ops.count(_C10D.all_reduce.default) == 0
    assert ops.count(_C10D.all_reduce_.default) == 1
    # new_empty, a's fill right after a's mul (before b's), b's fill, then the reduction
    assert ops[:6] == [
        torch.ops.aten.mul.Tensor,
        torch.ops.aten.new_empty.default,
        bucket_fill,
        torch.ops.aten.mul.Tensor,
        bucket_fill,
        _C10D.all_reduce_.default,
    ]
    out = next(n for n in g.nodes if n.op == "output")
    assert [tuple(v.meta["val"].shape) for v in out.args[0]] == [(4, 3), (5,)]
    g.lint()


def test_a_fill_lays_inputs_out_as_rows_of_columns():
    """Filled with ``rows`` = g (a reduce-scatter's group), rank r's share of every input
    is row r: the layout of concatenating each input's g rows side by side."""
    a, b = torch.arange(8.0).view(4, 2), torch.arange(10.0, 16.0)
    flat = torch.full((14,), -1.0)
    bucket_fill(bucket_fill(flat, 2, 0, a), 2, 4, b)
    assert torch.equal(flat, torch.cat([a.reshape(2, -1), b.reshape(2, -1)], 1).view(-1))


def test_no_buckets_under_a_zero_cap():
    g = _two_gradients()
    assert bucket_collectives(g, 0, tail=True) == []
    assert [n.target for n in g.nodes].count(_C10D.all_reduce.default) == 2
