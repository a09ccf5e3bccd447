"""End to end on LLaMA3-8B dims (slow: run with `pytest -m slow`)."""

from __future__ import annotations

import pytest

from autoplan.core.torch_adapter import Replicate
from autoplan.result.plan import param_kind
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run

BIG = ("tok_embeddings", "output", "attention.wq", "attention.wo", "feed_forward.w1",
       "feed_forward.w2", "feed_forward.w3")  # fmt: skip


@pytest.mark.slow
def test_8b_two_layers_tight_budget_shards_every_large_weight():
    """With 0.5 GiB per device no large weight stays replicated on both mesh axes."""
    pytest.importorskip("highspy")
    run = load_run("configs/llama3_8b_2l.yaml", ["plan.memory_budget_gib=0.5", "plan.solver=highs"])
    plan = run_plan(run, quiet=True)
    assert plan.status == "optimal"
    assert plan.memory_bytes <= 0.5 * 2**30
    for fqn, placements in plan.param_placements.items():
        if param_kind(fqn) in BIG:
            assert placements != (Replicate(), Replicate()), fqn


def test_8b_einsum_mode_leaves_no_linear_mm():
    """On LLaMA3-8B (2 layers) every projection, forward and both backward products, is an einsum."""
    import torch

    from autoplan.models.llama3 import Transformer, llama3_8b
    from autoplan.rewrite import rewrite
    from autoplan.trace.capture import trace_joint

    with torch.device("meta"):
        model = Transformer(llama3_8b(2))
    traced, stats = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128256, (16, 8192))), mm_mode="einsum"
    )
    targets = [str(n.target) for n in traced.gm.graph.nodes]
    assert (stats.forward, stats.grad_input, stats.grad_weight, stats.skipped) == (15, 15, 15, 0)
    assert "aten.mm.default" not in targets
    assert targets.count("aten.einsum.default") == 45
