"""Memory per device: the activations a step keeps for its backward, read off the graph
(autoplan.memory.activations, autoplan.memory.recompute), with and without recomputation.
Plans under budgets that count activations, and the estimate against the peak PyTorch's
MemTracker measures on 4 gloo processes, are in tests/integration/test_memory.py."""

from __future__ import annotations

import pytest
import torch

import autoplan
from autoplan.core.graph import RECOMPUTES, layer_of
from autoplan.memory.activations import cotangent_memory, saved_storage
from autoplan.memory.recompute import layer_names, recompute_set, with_recompute
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint
from tests.helpers.memory_plans import BATCH, SEQ


def test_the_kept_values_are_forward_values_the_backward_reads_never_placeholders():
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced = trace_joint(model, lambda: torch.randint(0, 128, (BATCH, SEQ)))
    kept = [traced.node(n) for n in saved_storage(traced)]
    assert kept and all(n.op == "call_function" for n in kept)
    assert traced.node(traced.outputs[0]) in kept  # the logits the caller holds
    ops = {str(n.target) for n in kept}
    assert "aten.embedding.default" in ops and "aten.rsqrt.default" in ops
    assert not any(getattr(n.target, "is_view", False) for n in kept)  # bases, not views


@pytest.mark.parametrize("mm_mode", ["einsum", "native"])
def test_the_kept_values_under_recomputation_are_read_off_the_graph_as_the_step_keeps_them(
    mm_mode,
):
    """saved_storage with a recompute set equals saved_storage of the graph with_recompute
    makes, for each mode and mixes of modes per layer."""
    with torch.device("meta"):
        model = Transformer(tiny(3))
    traced, _ = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (BATCH, SEQ))), mm_mode=mm_mode
    )
    layers = layer_names(traced)
    mixes = ["none", "selective", "full"]
    mixes += [
        dict(zip(layers, m, strict=True))
        for m in (("full", "none", "selective"), ("none", "full", "full"))
    ]
    seen = set()
    for mix in mixes:
        names = recompute_set(traced, mix)
        kept = saved_storage(traced, names)
        assert kept == saved_storage(with_recompute(traced, names)), mix
        seen.add(tuple(kept))
    assert len(seen) == len(mixes)  # each mix keeps other values


def test_the_outputs_gradient_is_counted_at_its_local_size_where_it_arrives():
    """The logits' gradient the backward holds, per strategy of the logits: their size
    over the axes that shard them; a partial sum's arrives whole on its axis."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced = trace_joint(model, lambda: torch.randint(0, 128, (BATCH, SEQ)))
    table = enumerate_strategies(traced, mesh)
    ((name, held),) = cotangent_memory(traced, table).items()
    assert name == traced.outputs[0]
    logits = BATCH * SEQ * 128 * 4
    strategies = table.nodes[name].strategies
    for s, nbytes in zip(strategies, held, strict=True):
        assert nbytes == logits / 2 ** sum(p.is_shard() for p in s.outs[0]), s
    assert any(p.is_partial() for s in strategies for p in s.outs[0])  # some arrive whole


def test_full_checkpointing_keeps_each_layers_input_and_recomputes_one_layer_at_a_time():
    """Full checkpointing keeps what one layer hands the next: a recomputed copy reads
    copies of its own layer only, so the backward recomputes one layer at a time (a copy
    of a layer's output would chain the recomputation back through every layer)."""
    with torch.device("meta"):
        model = Transformer(tiny(3))
    traced = trace_joint(model, lambda: torch.randint(0, 128, (BATCH, SEQ)))
    stepped = with_recompute(traced, recompute_set(traced, "full"))
    copies = [n for n in stepped.gm.graph.nodes if RECOMPUTES in n.meta]
    assert {layer_of(c) for c in copies} == {"layers.0", "layers.1", "layers.2"}
    for c in copies:
        assert all(layer_of(a) == layer_of(c) for a in c.all_input_nodes if RECOMPUTES in a.meta)
    order = {n: i for i, n in enumerate(stepped.gm.graph.nodes)}
    spans = {
        layer: (
            min(order[c] for c in copies if layer_of(c) == layer),
            max(order[u] for c in copies if layer_of(c) == layer for u in c.users),
        )
        for layer in ("layers.0", "layers.1", "layers.2")
    }
    # the backward runs the last layer first; each layer's copies die before the next's
    assert (
        spans["layers.2"][1] < spans["layers.1"][0] and spans["layers.1"][1] < spans["layers.0"][0]
    )
