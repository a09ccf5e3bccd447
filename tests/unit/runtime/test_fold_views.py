"""Folding view chains in lowered programs: fewer ops, the same values and layouts.

Each case traces a function with make_fx (as lowering does), folds a copy of its graph,
and runs both on the traced layout and on other layouts of the same input: the values
must agree wherever the unfolded chain runs, and the output strides on the traced one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.runtime.fold_views import fold_views

aten = torch.ops.aten


def _einsum_operand(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.einsum("abk,nk->abn", x, w)


def _unsqueeze_permute_view(x: torch.Tensor) -> torch.Tensor:
    y = x.unsqueeze(3).permute(0, 1, 3, 2).permute(0, 1, 3, 2)
    return y.reshape(1, x.shape[0] * x.shape[1], x.shape[2]) * 2


def _transposed_weight(w: torch.Tensor) -> torch.Tensor:
    y = w.t().unsqueeze(2).unsqueeze(3).permute(2, 3, 1, 0).permute(3, 2, 0, 1)
    return y.reshape(1, w.shape[1], w.shape[0]) + 1


def _split_then_permute(x: torch.Tensor) -> torch.Tensor:
    """view then permute: not a permute then a view of the input, so it stays."""
    return x.view(2, 3, 4, 5).permute(0, 2, 1, 3).sin()


def _detach_and_same_shape_views(x: torch.Tensor) -> torch.Tensor:
    return x.detach().view(x.shape).view(-1).view(x.shape) * 3


CASES = [
    (_einsum_operand, [(2, 8, 6), (5, 6)]),
    (_unsqueeze_permute_view, [(2, 8, 6)]),
    (_transposed_weight, [(5, 6)]),
    (_split_then_permute, [(6, 20)]),
    (_detach_and_same_shape_views, [(4, 6)]),
]


def _graphs(fn, shapes) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    gm = make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])
    folded = copy.deepcopy(gm)
    removed = fold_views(folded.graph)
    folded.recompile()
    return gm, folded, removed


def _layouts(shape: tuple[int, ...]) -> list[torch.Tensor]:
    """The same values contiguous, transposed in memory, and as a slice of a larger one."""
    x = torch.randn(shape)
    flipped = x.flip(0).contiguous().flip(0) if len(shape) == 1 else x.mT.contiguous().mT
    wide = torch.zeros(*shape[:-1], shape[-1] + 3)
    wide[..., : shape[-1]] = x
    return [x, flipped, wide[..., : shape[-1]]]


@pytest.mark.parametrize(("fn", "shapes"), CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_folded_program_equals_the_traced_one_on_any_layout(fn, shapes):
    gm, folded, _ = _graphs(fn, shapes)
    for layout in range(3):
        args = [_layouts(s)[layout] for s in shapes]
        try:
            want = gm(*args)
        except RuntimeError:  # the unfolded chain cannot view this layout: nothing to match
            continue
        got = folded(*args)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        if layout == 0:
            assert got.stride() == want.stride()


def _count(gm: fx.GraphModule, ops: set) -> int:
    return sum(n.target in ops for n in gm.graph.nodes)


def test_chains_become_one_view_or_a_permute_and_a_view():
    views = {aten.view.default, aten.permute.default, aten.unsqueeze.default, aten.t.default}
    gm, folded, removed = _graphs(_unsqueeze_permute_view, [(2, 8, 6)])
    assert _count(gm, views) >= 4 and _count(folded, views) == 1 and removed >= 3
    gm, folded, _ = _graphs(_transposed_weight, [(5, 6)])
    assert [n.target for n in folded.graph.nodes if n.target in views] == [
        aten.permute.default,
        aten.view.default,
    ]


def test_identity_views_and_detach_disappear():
    gm, folded, _ = _graphs(_detach_and_same_shape_views, [(4, 6)])
    assert [n.target for n in folded.graph.nodes if n.op == "call_function"] == [aten.mul.Tensor]


def test_a_view_of_a_permuted_split_is_kept():
    gm, folded, removed = _graphs(_split_then_permute, [(6, 20)])
    assert removed == 0 and len(folded.graph.nodes) == len(gm.graph.nodes)


def test_returned_views_keep_their_nodes():
    """A program's outputs name its saved values: a returned view is not replaced."""

    def fn(x):
        return x.detach(), x.unsqueeze(0).squeeze(0)

    gm, folded, removed = _graphs(fn, [(3, 4)])
    assert removed == 0
    assert [n.name for n in folded.graph.nodes] == [n.name for n in gm.graph.nodes]


def test_merged_dims_keep_their_order():
    """A permute whose dims are then merged folds to that permute and one view."""

    def fn(x):
        return x.permute(2, 0, 1).reshape(4, 6).unsqueeze(0).squeeze(0).cos()

    gm, folded, _ = _graphs(fn, [(2, 3, 4)])
    permutes = [n.args[1] for n in folded.graph.nodes if n.target is aten.permute.default]
    assert permutes == [[2, 0, 1]]
    assert _count(folded, {aten.view.default, aten.unsqueeze.default}) == 1
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(folded(x), gm(x), rtol=0, atol=0)


def test_a_fold_must_address_the_same_elements_not_only_the_same_strides():
    """An expanded scalar's transpose has the strides of the input itself, (0, 0): the
    identity would match the traced layout, but not the chain on a contiguous input."""

    def fn(x):
        return x.expand(2, 2).t() * 1

    gm, folded, removed = _graphs(fn, [(1, 1)])
    assert removed == 0 and _count(folded, {aten.t.default}) == 1
