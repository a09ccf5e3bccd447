"""Stage 3: candidate strategies from DTensor's rules, through the adapter."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoplan
from autoplan.core.placements import fmt
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies import full_mesh
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.strategies.ops import has_strided
from autoplan.trace.capture import trace_joint


@pytest.fixture(scope="module")
def llama_traced():
    with torch.device("meta"):
        model = Transformer(tiny(1))
    return trace_joint(model, lambda: torch.randint(0, 128, (4, 16)))


def _table(traced, mode):
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    return enumerate_strategies(traced, mesh, mm_mode=mode)


def test_cpu_attention_shards_on_batch_and_heads(llama_traced):
    """The CPU flash-attention op gets the GPU kernels' batch and head sharding."""
    table = _table(llama_traced, "native")
    attn = next(n for n in table.nodes.values() if "flash_attention_for_cpu.default" in n.op)
    outs = {fmt(s.outs[0]) for s in attn.strategies}
    assert {"S(0)S(1)", "S(1)S(0)", "S(0)S(0)", "RR"} <= outs
    assert not attn.fallback


def test_native_mode_offers_strided_shard_on_mm(llama_traced):
    """An mm fed by the flatten view of a two-axis-sharded tensor gets _StridedShard variants."""
    table = _table(llama_traced, "native")
    mms = [n for n in table.nodes.values() if n.op == "aten.mm.default"]
    assert mms
    assert any(has_strided(s) for n in mms for s in n.strategies)


def test_einsum_mode_offers_no_strided_shard():
    """With the einsum rewrite no strategy uses _StridedShard, and Linear mms are gone."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced, stats = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode="einsum"
    )
    assert stats.forward == 8 and stats.skipped == 0  # 7 per layer + output
    table = _table(traced, "einsum")
    assert not any(n.op == "aten.mm.default" for n in table.nodes.values())
    assert not any(has_strided(s) for n in table.nodes.values() for s in n.strategies)
    einsums = [n for n in table.nodes.values() if n.op == "aten.einsum.default"]
    assert len(einsums) == 3 * 8  # forward, grad-input, grad-weight


@pytest.mark.parametrize("mode", ["einsum", "native"])
def test_every_op_with_a_rule_can_run_fully_replicated(mode):
    """DTensor can always run an op replicated; the planner must offer that too (einsum's
    generator lists only sharded and partial rules, so it once had no RR strategy)."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced, _ = rewrite(trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode=mode)
    table = _table(traced, mode)
    missing = [
        name
        for name, n in table.nodes.items()
        if n.strategies and n.out_tensors[0] is not None
        and not any(s.outs[0] is not None and fmt(s.outs[0]) == "RR" for s in n.strategies)
    ]  # fmt: skip
    assert not missing, missing


def test_strategies_shard_evenly_only(llama_traced):
    """Every offered placement divides its tensor evenly over the mesh."""
    from autoplan.core.placements import is_even

    table = _table(llama_traced, "einsum")
    for n in table.nodes.values():
        for s in n.strategies:
            for p, t in zip(s.ins, n.in_tensors, strict=True):
                assert t is None or is_even(t.shape, p, table.mesh_shape), (n.name, fmt(p))


class _Trace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.trace(x * self.w)


def test_op_without_rule_falls_back_to_replicate_with_a_warning():
    """An op DTensor has no rule for runs replicated and is named once in a warning."""
    traced = trace_joint(_Trace(), lambda: torch.randn(8, 8))
    mesh = autoplan.fake_mesh((2,), ("dp",))
    with pytest.warns(UserWarning, match="no sharding rule"):
        table = enumerate_strategies(traced, mesh)
    assert table.fallback_ops
    for name in table.fallback_ops:
        nodes = [n for n in table.nodes.values() if n.op == name]
        assert all(fmt(s.outs[0]) == "R" for n in nodes for s in n.strategies)


class _Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + torch.arange(8, dtype=x.dtype)


def test_an_op_with_no_tensor_input_is_replicated_without_a_warning(recwarn):
    """arange (no tensor input, the same value on every rank) is replicated, and neither
    named as an op without a rule nor warned about."""
    traced = trace_joint(_Positions(), lambda: torch.randn(4, 8))
    table = enumerate_strategies(traced, autoplan.fake_mesh((2,), ("dp",)))
    assert not [w for w in recwarn if "no sharding rule" in str(w.message)]
    assert table.fallback_ops == ()
    (node,) = [n for n in table.nodes.values() if n.op == "aten.arange.default"]
    assert [fmt(s.outs[0]) for s in node.strategies] == ["R"] and not node.fallback


def test_strided_variants_appear_exactly_when_an_input_carries_one(llama_traced):
    """An mm offers _StridedShard strategies iff one of its inputs may arrive strided."""
    table = _table(llama_traced, "native")
    checked = 0
    for n in table.nodes.values():
        if n.op != "aten.mm.default":
            continue
        fed_strided = any(
            has_strided_placement(s.outs[ref.index])
            for ref in n.inputs
            for s in table.nodes[ref.node].strategies
        )
        offers = any(has_strided(s) for s in n.strategies)
        assert offers == fed_strided, n.name
        checked += 1
    assert checked >= 8


def has_strided_placement(placements) -> bool:
    from autoplan.core.torch_adapter import _StridedShard

    return placements is not None and any(isinstance(p, _StridedShard) for p in placements)


def test_split_factor_one_is_offered_by_views_but_never_expanded_on_mm():
    """Batch 2 on 2x2: flattening a batch sharded to one row per rank makes _S(0,1), which
    is S(0); the mm rules are not filled with it, so no strategy is listed twice."""
    from autoplan.core.placements import is_strided, plain

    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced = trace_joint(model, lambda: torch.randint(0, 128, (2, 16)))
    table = _table(traced, "native")

    def ones(placements) -> bool:
        return placements is not None and any(
            is_strided(p) and p.split_factor == 1 for p in placements
        )

    views = [n for n in table.nodes.values() if "view" in n.op]
    assert any(ones(s.outs[0]) for n in views for s in n.strategies)
    for n in table.nodes.values():
        if n.op == "aten.mm.default":
            assert not any(ones(p) for s in n.strategies for p in (*s.outs, *s.ins)), n.name
        seen = {
            (tuple(map(plain, filter(None, s.outs))), tuple(map(plain, s.ins)))
            for s in n.strategies
        }
        assert len(seen) == len(n.strategies), f"{n.name} lists a layout twice"


def test_candidates_asked_in_batches_give_the_strategies_asked_at_once(monkeypatch):
    """A one-input full-mesh node's candidates are asked a batch at a time (cached run);
    the uncached run asks all at once. Tiny batches must give the same strategies."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    traced, _ = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode="native"
    )
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    monkeypatch.setattr(full_mesh, "_BATCH", 3)
    asked: dict[str, list[int]] = {}  # one-input node -> candidates per call
    real = full_mesh._ask

    def ask(node, m, cands, *rest):
        args = [a for a in node.all_input_nodes if "val" in a.meta]
        if len(args) == 1 and not isinstance(node.args[0], (list, tuple)):
            asked.setdefault(node.name, []).append(len(cands(args[0])))
        return real(node, m, cands, *rest)

    monkeypatch.setattr(full_mesh, "_ask", ask)
    batched = enumerate_strategies(traced, mesh, mm_mode="native", cache=True)
    assert max(n for calls in asked.values() for n in calls) <= 3
    assert max(sum(calls) for calls in asked.values()) > 3  # some node took several batches
    whole = enumerate_strategies(traced, mesh, mm_mode="native", cache=False)
    for name in whole.nodes:
        # repr, not ==: a masked partial's equality includes its per-run mask buffer
        assert repr(batched.nodes[name].strategies) == repr(whole.nodes[name].strategies), name
