"""Hugging Face models: run files with ``model.hf`` plan, a user's own model plans like
``build_hf``'s, plans execute on 4 gloo ranks (slow), and the sdpa registration is
checked in a fresh interpreter."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.nn.attention import SDPBackend, sdpa_kernel

import autoplan
from autoplan.core.placements import fmt
from autoplan.models import hf
from autoplan.result.plan import Plan
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import Run, load_run
from tests.helpers.gloo import run_workers
from tests.helpers.isolated import run_isolated
from tests.helpers.paths import CONFIGS

pytest.importorskip("transformers")


GPT2 = CONFIGS / "hf_gpt2_tiny.yaml"


LLAMA = CONFIGS / "hf_llama_tiny.yaml"
MIXTRAL = CONFIGS / "hf_mixtral_tiny.yaml"


def _assert_planned(run: Run, plan: Plan) -> None:
    names = {n for n, _ in run.build_model().named_parameters()}
    assert plan.status == "optimal"
    assert set(plan.param_placements) == names
    assert all(len(p) == 2 for p in plan.param_placements.values())
    # Every op has a rule (the rotary / position arange is replicated, not a fallback).
    assert not plan.fallback_ops, plan.fallback_ops


@pytest.mark.parametrize("path", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_tiny_config_plans_on_2x2(path):
    """The shipped gpt2 / llama tiny configs plan to optimal on (dp=2, tp=2), every parameter placed."""
    run = load_run(path)
    assert run.mesh_shape == (2, 2)
    _assert_planned(run, run_plan(run, quiet=True))


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_qwen2_and_mistral_plan(kind):
    """qwen2 and mistral take the tiny LLaMA config's fields and plan too (one layer)."""
    run = load_run(LLAMA, [f"model.hf={kind}", "model.config.num_hidden_layers=1"])
    assert run.hf_kind == kind
    model = run.build_model()
    assert type(model).__mro__[1].__name__ == f"{kind.capitalize()}ForCausalLM"
    _assert_planned(run, run_plan(run, quiet=True))


WORLD = 4


RTOL, ATOL = 1e-4, 1e-5


def _close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL)), float((a - b).abs().max())


def _check(case: dict, mesh) -> dict:
    """Loss, gradients and one SGD step of the planned model against one device.

    SDPA's math backend on both sides: DTensor has no rule for the fused CPU kernel the
    plan was traced with; ``implicit_replication`` lets the position ids (a plain tensor)
    meet DTensors.
    """
    plan = Plan.from_json(case["plan"])
    torch.manual_seed(0)
    model = hf.build_hf(case["kind"], case["config"], device="cpu")
    torch.manual_seed(1)
    x = torch.randint(0, case["vocab"], (case["batch"], case["seq"]))
    with sdpa_kernel(SDPBackend.MATH), implicit_replication():
        ref = copy.deepcopy(model)
        ref_loss = ref(x).float().mean()
        ref_loss.backward()
        torch.optim.SGD(ref.parameters(), lr=0.1).step()
        pmodel = parallelize(model, plan, mesh)
        (xd,) = shard_inputs(x, [case["input"]], mesh)
        loss = pmodel(xd).float().mean()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
        loss.backward()
        grads = full_gradients(pmodel)
        torch.optim.SGD(pmodel.parameters(), lr=0.1).step()
    ref_params = dict(ref.named_parameters())
    return {
        "placed": {n: fmt(p.placements) for n, p in pmodel.named_parameters()},
        "loss": _close(loss.detach(), ref_loss.detach()),
        "grads": {n: _close(g, ref_params[n].grad) for n, g in grads.items()},
        "missing_grads": sorted(set(ref_params) - set(grads)),
        "sgd": {
            n: _close(p.full_tensor().detach(), ref_params[n].detach())
            for n, p in pmodel.named_parameters()
        },
    }


def _cases(rank: int, cases: list[dict]) -> dict:
    results = {}
    for case in cases:
        plan = Plan.from_json(case["plan"])
        mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
        results[case["name"]] = _check(case, mesh)
    return results


def _case(name: str, path: Path, overrides: list[str]) -> dict:
    run = load_run(path, overrides)
    return {
        "name": name,
        "kind": run.hf_kind,
        "config": run.model_args,
        "vocab": hf.make_config(run.hf_kind, run.model_args).vocab_size,
        "batch": run.batch,
        "seq": run.seq,
        "input": fmt(run.input_placements[0]),
        "plan": run_plan(run, quiet=True).to_json(),
    }


@pytest.mark.slow
def test_hf_plans_execute_on_4_gloo_ranks(tmp_path):
    """gpt2 and llama tiny plans, free and memory-tight, match one device under apply.parallelize."""
    cases = [
        _case("gpt2", GPT2, []),
        _case("gpt2_tight", GPT2, ["plan.memory_budget_gib=0.0005"]),
        _case("llama", LLAMA, []),
        _case("llama_tight", LLAMA, ["plan.memory_budget_gib=0.0006", "plan.solver=highs"]),
    ]
    results = run_workers(_cases, WORLD, str(tmp_path), cases)[0]
    for name, result in results.items():
        assert result["loss"][0], f"{name}: loss differs by {result['loss'][1]:.3g}"
        assert not result["missing_grads"], (name, result["missing_grads"])
        bad = {n: d for n, (ok, d) in result["grads"].items() if not ok}
        assert not bad, f"{name}: gradients differ (max abs diff): {bad}"
        bad = {n: d for n, (ok, d) in result["sgd"].items() if not ok}
        assert not bad, f"{name}: weights after one SGD step differ: {bad}"
    # The tight budgets force sharded weights, so execution covers more than replication.
    for name in ("gpt2_tight", "llama_tight"):
        assert any("S(" in p for p in results[name]["placed"].values()), results[name]["placed"]


# transformers' Qwen3-MoE (its attention's q/k norms included) at the tiny Mixtral's size
QWEN3_MOE = {
    "num_hidden_layers": 2, "hidden_size": 64, "moe_intermediate_size": 128,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 128, "max_position_embeddings": 64, "num_experts": 4,
    "num_experts_per_tok": 2, "capacity_factor": 1.25, "group_size": 64,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_an_hf_moe_expert_parallel_plan_runs_on_4_gloo_ranks_as_on_one_device(tmp_path, kind):
    """The tiny Hugging Face Mixtral and Qwen3-MoE with every layer's experts split by
    expert over ep (their capacity-form experts, hf_experts): loss, gradients and one SGD
    step match one device."""
    pins = {
        f"model.layers.{i}.mlp.experts.{w}": "RS(0)"
        for i in range(2)
        for w in ("gate_up_proj", "down_proj")
    }
    path = tmp_path / f"{kind}_ep.yaml"
    lines = [f'    {fqn}: "{p}"' for fqn, p in pins.items()]
    path.write_text(MIXTRAL.read_text() + "constraints:\n  pin:\n" + "\n".join(lines) + "\n")
    overrides = ["plan.solver=highs"]
    if kind == "qwen3_moe":
        overrides += ["model.hf=qwen3_moe", f"model.config={json.dumps(QWEN3_MOE)}"]
    case = _case(f"{kind}_ep", path, overrides)
    result = run_workers(_cases, WORLD, str(tmp_path), [case])[0][f"{kind}_ep"]
    assert {fqn: result["placed"][fqn] for fqn in pins} == pins
    assert result["loss"][0], f"loss differs by {result['loss'][1]:.3g}"
    assert not result["missing_grads"], result["missing_grads"]
    bad = {n: d for n, (ok, d) in result["grads"].items() if not ok}
    assert not bad, f"gradients differ (max abs diff): {bad}"
    bad = {n: d for n, (ok, d) in result["sgd"].items() if not ok}
    assert not bad, f"weights after one SGD step differ: {bad}"


def test_autoplan_sdpa_is_registered_by_building_or_preparing_only():
    """In a fresh interpreter: importing, validating a config and building an eager model
    leave transformers' registries alone; build_hf and prepare register autoplan_sdpa."""
    seen = run_isolated("""
        import json
        import torch
        from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
        from transformers.masking_utils import AttentionMaskInterface
        from autoplan.models import hf

        def registered():
            return [hf.SDPA in AttentionInterface(), hf.SDPA in AttentionMaskInterface()]

        seen = {"import": registered()}
        hf.config_keys("gpt2"), hf.make_config("gpt2", {"n_layer": 1})
        seen["config"] = registered()
        hf.build_hf("gpt2", {"n_layer": 1, "attn_implementation": "eager"})
        seen["eager"] = registered()
        hf.build_hf("gpt2", {"n_layer": 1})
        seen["build_hf"] = registered()
        AttentionInterface._global_mapping.pop(hf.SDPA)
        AttentionMaskInterface._global_mapping.pop(hf.SDPA)
        config = LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                             intermediate_size=64, vocab_size=64)
        with torch.device("meta"):
            hf.prepare(LlamaForCausalLM(config))
        seen["prepare"] = registered()
        print(json.dumps(seen))
    """)
    assert seen == {
        "import": [False, False],
        "config": [False, False],
        "eager": [False, False],
        "build_hf": [True, True],
        "prepare": [True, True],
    }


def test_the_capacity_experts_are_registered_by_building_or_preparing_only():
    """In a fresh interpreter: importing and validating a Mixtral config leave
    transformers' experts registry alone; build_hf registers autoplan_capacity, and
    prepare registers it and sets a user's own Mixtral to it."""
    seen = run_isolated("""
        import json
        import torch
        from transformers import MixtralConfig, MixtralForCausalLM
        from transformers.integrations.moe import ExpertsInterface
        from autoplan.models import hf, hf_experts

        def registered():
            return hf_experts.NAME in ExpertsInterface._global_mapping

        seen = {"import": registered()}
        hf.make_config("mixtral", {"num_hidden_layers": 1})
        seen["config"] = registered()
        hf.build_hf("mixtral", {"num_hidden_layers": 1, "hidden_size": 32,
                                "intermediate_size": 48, "num_attention_heads": 4,
                                "num_key_value_heads": 2})
        seen["build_hf"] = registered()
        ExpertsInterface._global_mapping.pop(hf_experts.NAME)
        config = MixtralConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                               num_key_value_heads=2,
                               intermediate_size=64, vocab_size=64)
        with torch.device("meta"):
            model = hf.prepare(MixtralForCausalLM(config))
        seen["prepare"] = [registered(), model.config._experts_implementation]
        print(json.dumps(seen))
    """)
    assert seen == {
        "import": False,
        "config": False,
        "build_hf": True,
        "prepare": [True, "autoplan_capacity"],
    }


def test_a_users_own_hf_model_is_prepared_to_plan_like_build_hfs():
    """LlamaForCausalLM(LlamaConfig(...)) as a user builds it: refused with the fix while it
    keeps a KV cache; after hf.prepare, planned with its attention sharded (no fallback)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)

    def batch():
        ids = torch.randint(0, 64, (8, 16))
        return {"input_ids": ids, "labels": ids}

    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    with pytest.raises(ValueError, match=r"KV cache: set model\.config\.use_cache = False"):
        autoplan.plan(model, batch, mesh)
    plan = autoplan.plan(hf.prepare(model), batch, mesh, input_placements="S(0)R")
    assert plan.status == "optimal"
    assert not any("attention" in op for op in plan.fallback_ops), plan.fallback_ops
