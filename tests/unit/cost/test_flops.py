"""Tests for autoplan.cost.flops: the einsum FLOP formula and op_flops, checked against torch."""

import importlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import autoplan.cost.flops as flops
from autoplan.cost.flops import op_flops
from autoplan.rewrite.einsum import rewrite_linear_to_einsum
from tests.helpers.tracing import trace_step

aten = torch.ops.aten


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def einsum_flops(equation: str, *shapes: tuple[int, ...], path: list[int] | None = None) -> int:
    tensors = [meta(*s) for s in shapes]
    kwargs = {} if path is None else {"path": path}
    out = torch.einsum(equation, *tensors)
    return op_flops(aten.einsum.default, (equation, tensors), kwargs, out)


def test_torchs_registry_is_left_alone() -> None:
    """Importing the module again and pricing an einsum add nothing to torch's registry."""
    registry = dict(flop_counter.flop_registry)
    importlib.reload(flops)
    assert einsum_flops("ik,kn->in", (32, 64), (64, 100)) == 2 * 32 * 64 * 100
    assert flop_counter.flop_registry == registry


def test_an_einsum_formula_registered_with_torch_wins(monkeypatch) -> None:
    """A formula someone registers for einsum in torch's registry is used over autoplan's."""
    formula = flop_counter.shape_wrapper(lambda *args, **kwargs: 7)
    monkeypatch.setitem(flop_counter.flop_registry, aten.einsum, formula)
    assert einsum_flops("ik,kn->in", (32, 64), (64, 100)) == 7


@pytest.mark.parametrize("batch", [(2, 16), (2, 3, 5)])
def test_linear_einsums_cost_2_batch_k_n(batch: tuple[int, ...]) -> None:
    """Forward, grad-input and grad-weight einsums of a rank 3 or 4 Linear cost 2*prod(b)*K*N."""
    k, n = 64, 100
    b = "abc"[: len(batch)]
    expected = 2 * math.prod(batch) * k * n
    assert einsum_flops(f"{b}k,kn->{b}n", (*batch, k), (k, n)) == expected
    assert einsum_flops(f"{b}n,nk->{b}k", (*batch, n), (n, k)) == expected
    assert einsum_flops(f"{b}n,{b}k->nk", (*batch, n), (*batch, k)) == expected


def test_einsum_of_matrices_equals_mm() -> None:
    """Einsum "ik,kn->in" costs what torch's mm formula says for the same shapes."""
    a, b = meta(32, 64), meta(64, 100)
    assert einsum_flops("ik,kn->in", (32, 64), (64, 100)) == op_flops(
        aten.mm.default, (a, b), {}, a @ b
    )


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 6)]),
        ("...k,kn->...n", [(2, 3, 5), (5, 7)]),
        ("ij,jk", [(3, 4), (4, 5)]),
    ],
)
def test_einsum_formula_matches_flop_counter(equation: str, shapes: list[tuple[int, ...]]) -> None:
    """Batched, 3-operand, ellipsis and implicit-output einsums count as torch's decomposition."""
    tensors = [torch.randn(s) for s in shapes]
    with FlopCounterMode(display=False) as counter:
        out = torch.einsum(equation, *tensors)
    assert op_flops(aten.einsum.default, (equation, tensors), {}, out) == counter.get_total_flops()


def test_einsum_path_is_followed() -> None:
    """An explicit contraction path is priced in its own order, as aten runs it."""
    tensors = [torch.randn(s) for s in [(3, 4), (4, 5), (5, 6)]]
    path = [1, 2, 0, 1]
    with FlopCounterMode(display=False) as counter:
        aten.einsum.default("ij,jk,kl->il", tensors, path=path)
    assert einsum_flops("ij,jk,kl->il", (3, 4), (4, 5), (5, 6), path=path) == (
        counter.get_total_flops()
    )
    assert counter.get_total_flops() == 2 * 4 * 5 * 6 + 2 * 3 * 4 * 6


def test_single_operand_einsum_is_free() -> None:
    """A one-operand einsum (sum, permute) costs 0 like torch's reductions."""
    assert einsum_flops("abc->cb", (2, 3, 4)) == 0


def test_op_flops_accepts_shape_carriers() -> None:
    """Objects with a .shape (e.g. fx TensorMetadata) work where tensors do."""
    x, w = SimpleNamespace(shape=(2, 16, 64)), SimpleNamespace(shape=(64, 100))
    out = SimpleNamespace(shape=(2, 16, 100))
    assert op_flops(aten.einsum, ("abk,kn->abn", [x, w]), None, out) == 2 * 32 * 64 * 100


def test_op_without_formula_costs_zero() -> None:
    """Ops missing from torch's registry cost 0."""
    x = meta(4, 4)
    assert op_flops(aten.relu.default, (x,), {}, x) == 0


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 24, bias=False)
        self.down = nn.Linear(24, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


def counted_flops(gm: torch.fx.GraphModule, *args: object) -> int:
    with FlopCounterMode(display=False) as counter:
        gm(*args)
    return counter.get_total_flops()


def graph_flops(gm: torch.fx.GraphModule) -> int:
    """Sum of op_flops over the graph's nodes, priced from their meta['val']."""

    def val(a: object) -> object:
        if isinstance(a, torch.fx.Node):
            return a.meta["val"]
        if isinstance(a, dict):
            return {k: val(v) for k, v in a.items()}
        if isinstance(a, list | tuple):
            return [val(v) for v in a]
        return a

    return sum(
        op_flops(n.target, val(n.args), val(n.kwargs), n.meta["val"])
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


@pytest.mark.parametrize("shape", [(2, 5, 16), (2, 3, 5, 16)])
def test_rewritten_graph_flops_equal_mm_graph(shape: tuple[int, ...]) -> None:
    """FlopCounterMode and op_flops give the einsum graph the mm graph's FLOPs."""
    model, x = MLP(), torch.randn(shape)
    params = list(model.parameters())
    mm_graph = trace_step(model, x)
    einsum_graph = trace_step(model, x)
    assert rewrite_linear_to_einsum(einsum_graph).skipped == 0
    expected = counted_flops(mm_graph, params, x)
    assert expected > 0
    assert counted_flops(einsum_graph, params, x) == expected
    assert graph_flops(mm_graph) == graph_flops(einsum_graph) == expected
