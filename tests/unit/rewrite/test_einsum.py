"""Tests for autoplan.rewrite.einsum: Linear matmuls traced by make_fx become einsums."""

import warnings
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.rewrite.einsum import RewriteStats, rewrite_linear_to_einsum
from tests.helpers.tracing import trace_step

aten = torch.ops.aten


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 24) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.mid = nn.Linear(hidden, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.mid(F.relu(self.up(x)))))


class Attention(nn.Module):
    def __init__(self, dim: int = 16, num_heads: int = 2) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.num_heads) ** 0.5, dim=-1)
        return self.wo((att @ v).transpose(1, 2).reshape(b, s, d))


def mms(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is aten.mm.default]


def einsums(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is aten.einsum.default]


def test_mlp_3d_every_linear_product_becomes_einsum() -> None:
    """A 3-layer MLP on [b, s, d]: 3 forward, 2 grad-input, 3 grad-weight einsums, no mm left."""
    gm = trace_step(MLP(), torch.randn(2, 5, 16))
    stats = rewrite_linear_to_einsum(gm)
    assert stats == RewriteStats(forward=3, grad_input=2, grad_weight=3)
    assert mms(gm) == []
    equations = sorted(n.args[0] for n in einsums(gm))
    assert equations == ["abk,kn->abn"] * 3 + ["abn,abk->nk"] * 3 + ["abn,nk->abk"] * 2


def test_4d_input_linear() -> None:
    """A Linear on a rank-4 input gets three batch letters in every einsum."""
    gm = trace_step(MLP(), torch.randn(2, 3, 5, 16))
    stats = rewrite_linear_to_einsum(gm)
    assert (stats.forward, stats.grad_input, stats.grad_weight, stats.skipped) == (3, 2, 3, 0)
    assert mms(gm) == []
    assert {n.args[0] for n in einsums(gm)} == {"abck,kn->abcn", "abcn,nk->abck", "abcn,abck->nk"}


def test_attention_projections_leave_no_mm() -> None:
    """q/k/v/o projections of an attention block are all rewritten; its bmms are untouched."""
    gm = trace_step(Attention(), torch.randn(2, 6, 16))
    num_bmm = sum(n.target is aten.bmm.default for n in gm.graph.nodes)
    stats = rewrite_linear_to_einsum(gm)
    # q/k/v read the step's input, which needs no grad: only wo has a grad-input product.
    assert (stats.forward, stats.grad_input, stats.grad_weight) == (4, 1, 4)
    assert mms(gm) == []
    assert sum(n.target is aten.bmm.default for n in gm.graph.nodes) == num_bmm


def test_linear_id_pairs_forward_with_its_backward() -> None:
    """Each Linear's forward, grad-input and grad-weight einsums share one autoplan_linear_id."""
    gm = trace_step(MLP(), torch.randn(2, 5, 16))
    rewrite_linear_to_einsum(gm)
    by_id = defaultdict(list)
    for node in einsums(gm):
        by_id[node.meta["autoplan_linear_id"]].append(node.args[0])
    assert sorted(map(sorted, by_id.values())) == [
        ["abk,kn->abn", "abn,abk->nk"],  # first layer: its input needs no grad
        ["abk,kn->abn", "abn,abk->nk", "abn,nk->abk"],
        ["abk,kn->abn", "abn,abk->nk", "abn,nk->abk"],
    ]


def test_einsum_meta_val_matches_real_output() -> None:
    """Every new einsum's meta['val'] has the shape, strides and dtype of the tensor it
    computes (the value is made from a run on meta tensors, not on fake ones)."""
    model = MLP()
    gm = trace_step(model, torch.randn(2, 5, 16))
    rewrite_linear_to_einsum(gm)
    real = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            real[n] = super().run_node(n)
            return real[n]

    Record(gm).run(list(model.parameters()), torch.randn(2, 5, 16))
    for node in einsums(gm):
        val = node.meta["val"]
        out = real[node]
        assert (val.shape, val.stride(), val.dtype) == (out.shape, out.stride(), out.dtype)


def test_fake_trace_gets_fake_vals_of_its_mode() -> None:
    """On a trace over fake tensors the einsum vals are fake tensors of the trace's mode."""
    model = MLP()
    with FakeTensorMode() as mode:
        params = [mode.from_tensor(p) for p in model.parameters()]
        x = torch.empty(2, 5, 16)
    names = [n for n, _ in model.named_parameters()]

    def step(params, x):
        out = torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))
        loss = out.float().mean()
        return loss, torch.autograd.grad(loss, params)

    gm = make_fx(step)(params, x)
    assert rewrite_linear_to_einsum(gm).forward == 3
    assert all(n.meta["val"].fake_mode is mode for n in einsums(gm))


def test_biased_linear_keeps_addmm_and_rewrites_its_backward() -> None:
    """With bias the forward stays addmm; its grad-input and grad-weight mms become einsums."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8))
    x, params = torch.randn(2, 5, 16), list(model.parameters())
    gm = trace_step(model, x)
    before = gm(params, x)
    stats = rewrite_linear_to_einsum(gm)
    assert (stats.forward, stats.grad_input, stats.grad_weight, stats.skipped) == (0, 1, 2, 0)
    assert sum(n.target is aten.addmm.default for n in gm.graph.nodes) == 2
    by_id = defaultdict(list)
    for node in einsums(gm):
        by_id[node.meta["autoplan_linear_id"]].append(node.args[0])
    assert sorted(map(sorted, by_id.values())) == [["abn,abk->nk"], ["abn,abk->nk", "abn,nk->abk"]]
    torch.testing.assert_close(gm(params, x), before)


@pytest.mark.parametrize(
    ("model_cls", "shape"), [(MLP, (2, 6, 16)), (MLP, (2, 3, 4, 16)), (Attention, (2, 6, 16))]
)
def test_rewrite_keeps_loss_and_grads(model_cls: type[nn.Module], shape: tuple[int, ...]) -> None:
    """The rewritten graph gives the same loss and gradients as the mm graph and eager autograd."""
    torch.manual_seed(0)
    model = model_cls()
    x = torch.randn(shape)
    params = list(model.parameters())
    gm = trace_step(model, x)
    before = gm(params, x)
    rewrite_linear_to_einsum(gm)
    assert mms(gm) == []
    after = gm(params, x)
    torch.testing.assert_close(after, before)
    loss = model(x).float().mean()
    torch.testing.assert_close(after, (loss, torch.autograd.grad(loss, params)))


def assert_left_alone(gm: torch.fx.GraphModule, stats: RewriteStats, reason: str) -> None:
    assert (stats.forward, stats.grad_input, stats.grad_weight) == (0, 0, 0)
    assert stats.skipped == len(mms(gm)) == 1
    assert einsums(gm) == []
    assert reason in stats.reasons[0], stats.reasons


def test_flatten_of_leading_dims_only_is_left_alone() -> None:
    """A view merging only the first two of four dims ([2,3,4,5] -> [6,20]) is not a flatten."""
    gm = make_fx(lambda x, w: (x.view(6, 20) @ w).view(2, 3, 8))(
        torch.randn(2, 3, 4, 5), torch.randn(20, 8)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "does not flatten exactly all leading dims")


def test_rank2_linear_is_left_alone() -> None:
    """A Linear on a rank-2 input is a plain mm with nothing to unflatten: every mm stays."""
    gm = trace_step(MLP(), torch.randn(8, 16))
    num_mm = len(mms(gm))
    stats = rewrite_linear_to_einsum(gm)
    assert (stats.forward, stats.grad_input, stats.grad_weight) == (0, 0, 0)
    assert stats.skipped == len(mms(gm)) == num_mm
    assert all("not a flatten view" in r for r in stats.reasons), stats.reasons


def test_unflatten_to_other_batch_dims_is_left_alone() -> None:
    """view([2,16,64] -> [32,64]) @ w -> view([4,8,100]) changes the batch dims: no rewrite."""
    gm = make_fx(lambda x, w: (x.view(32, 64) @ w).view(4, 8, 100))(
        torch.randn(2, 16, 64), torch.randn(64, 100)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "does not restore batch dims [2, 16]")


def test_grad_weight_with_different_batch_dims_is_left_alone() -> None:
    """t(view(g [2,16,8])) @ view(x [4,8,5]) contracts unequal batch dims: no rewrite."""
    gm = make_fx(lambda g, x: g.view(32, 8).t() @ x.view(32, 5))(
        torch.randn(2, 16, 8), torch.randn(4, 8, 5)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "differ")


def test_permute_that_is_not_a_transpose_is_left_alone() -> None:
    """permute(view(g), [0, 1]) @ view(x) is not the grad-weight form."""
    gm = make_fx(lambda g, x: g.view(8, 8).permute(0, 1) @ x.view(8, 5))(
        torch.randn(2, 4, 8), torch.randn(2, 4, 5)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "permutes dims [0, 1], not [1, 0]")


def test_permute_1_0_counts_as_transpose() -> None:
    """permute(view(g), [1, 0]) @ view(x) is rewritten like t(view(g)) @ view(x)."""
    gm = make_fx(lambda g, x: g.view(8, 8).permute(1, 0) @ x.view(8, 5))(
        torch.randn(2, 4, 8), torch.randn(2, 4, 5)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert stats.grad_weight == 1 and mms(gm) == []


def test_weight_of_wrong_shape_is_left_alone() -> None:
    """A weight operand whose meta['val'] is not 2-D [K, N] (malformed meta) stops the match."""
    gm = make_fx(lambda x, w: F.linear(x, w))(torch.randn(2, 4, 16), torch.randn(8, 16))
    (weight,) = [n for n in gm.graph.nodes if n.target is aten.t.default]
    weight.meta["val"] = weight.meta["val"].unsqueeze(-1)
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "not 2-D [16, N]")


def test_mm_used_without_unflatten_is_left_alone() -> None:
    """view(x) @ w whose [M, N] result is used as is has no unflatten to fold."""
    gm = make_fx(lambda x, w: x.view(8, 16) @ w)(torch.randn(2, 4, 16), torch.randn(16, 8))
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "not only by views")


def test_symbolic_shapes_are_left_alone() -> None:
    """A trace with SymInt shapes does not match; the reason names the symbolic shape."""
    gm = make_fx(lambda x, w: F.linear(x, w), tracing_mode="symbolic")(
        torch.randn(2, 4, 16), torch.randn(8, 16)
    )
    stats = rewrite_linear_to_einsum(gm)
    assert_left_alone(gm, stats, "symbolic shape")


def test_shared_flatten_is_kept_for_its_other_users() -> None:
    """A flatten view that something else also reads survives the rewrite of its mm."""

    def f(x, w):
        flat = x.view(8, 16)
        return (flat @ w).view(2, 4, 8), flat.sum()

    x, w = torch.randn(2, 4, 16), torch.randn(16, 8)
    gm = make_fx(f)(x, w)
    expected = gm(x, w)
    stats = rewrite_linear_to_einsum(gm)
    assert stats.forward == 1 and mms(gm) == []
    assert sum(n.target is aten.view.default for n in gm.graph.nodes) == 1
    torch.testing.assert_close(gm(x, w), expected)


def test_stats_print_short() -> None:
    """RewriteStats prints its counts on one line."""
    stats = RewriteStats(forward=1, grad_input=2, grad_weight=3, skipped=4)
    assert str(stats) == "einsum rewrite: 1 forward, 2 grad_input, 3 grad_weight, 4 skipped"


def test_gram_product_of_one_flatten() -> None:
    """t(view(x)) @ view(x) reads one flatten twice: rewritten, and erased once, no warnings."""
    x = torch.randn(2, 4, 8)

    def gram(x):
        flat = x.view(8, 8)
        return flat.t() @ flat

    gm = make_fx(gram)(x)
    assert sum(n.target is aten.view.default for n in gm.graph.nodes) == 1
    expected = gm(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = rewrite_linear_to_einsum(gm)
    assert stats.grad_weight == 1 and mms(gm) == []
    torch.testing.assert_close(gm(x), expected)
