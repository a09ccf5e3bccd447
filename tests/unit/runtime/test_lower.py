"""lower: the scheduling pass on lowered graphs (the lowering itself runs in the gloo cases
of tests/integration/test_apply.py, which assert the lowered graph's collectives are the
priced ones)."""

from __future__ import annotations

import torch
from torch import fx

from autoplan.runtime.lower import defer_waits

_C10D = torch.ops._c10d_functional


def _graph() -> fx.Graph:
    """x -> all_reduce -> wait, then two ops that do not read it, then one that does."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    reduced = g.call_function(_C10D.all_reduce.default, (x, "sum", "0"))
    waited = g.call_function(_C10D.wait_tensor.default, (reduced,))
    a = g.call_function(torch.ops.aten.mul.Tensor, (y, y))
    b = g.call_function(torch.ops.aten.add.Tensor, (a, y))
    c = g.call_function(torch.ops.aten.add.Tensor, (b, waited))
    g.output(c)
    return g


def test_a_wait_moves_to_just_before_its_first_reader():
    """The wait leaves its collective's side and lands right before the add that reads it;
    the collective itself stays where it was issued."""
    g = _graph()
    assert defer_waits(g) == 1
    order = [n.name for n in g.nodes]
    assert order == [
        "x", "y", "all_reduce_default", "mul_tensor", "add_tensor", "wait_tensor_default",
        "add_tensor_1", "output",
    ]  # fmt: skip
    g.lint()


def test_a_wait_already_next_to_its_reader_stays():
    """A second pass has nothing left to move."""
    g = _graph()
    defer_waits(g)
    assert defer_waits(g) == 0
