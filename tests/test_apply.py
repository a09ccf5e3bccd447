"""apply.parallelize: a planned model on 4 gloo processes matches one device.

Plans are made in this (parent) process on a fake mesh; children get them as JSON,
because the fake process group and the real gloo group must not share a process.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.nn.attention import SDPBackend, sdpa_kernel

import autoplan
from autoplan.apply import full_gradients, parallelize, shard_inputs
from autoplan.models.llama3 import Transformer, tiny
from autoplan.models.mlp import TinyMLP
from autoplan.placements import fmt, parse
from autoplan.plan import Plan

WORLD = 4
RTOL, ATOL = 1e-4, 1e-5
MLP_NUMEL = 2 * 2 * 64 * 256


def _mlp() -> torch.nn.Module:
    return TinyMLP(dim=64, hidden=256, n_layers=2)


def _llama() -> torch.nn.Module:
    return Transformer(tiny(2))


MODELS = {
    "mlp": (_mlp, lambda: torch.randn(16, 32, 64)),
    "llama": (_llama, lambda: torch.randint(0, 128, (8, 16))),
}


def _plan(kind: str, shape, names, input_placement: str, budget_gib=None) -> Plan:
    build, input_fn = MODELS[kind]
    with torch.device("meta"):
        model = build()
    return autoplan.plan(
        model,
        input_fn,
        autoplan.fake_mesh(shape, names),
        config=autoplan.PlanConfig(memory_budget_gib=budget_gib),
        input_placements=[input_placement],
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL)), float((a - b).abs().max())


def _check_case(kind: str, plan: Plan, input_placement: str, mesh) -> dict:
    """One case on this rank: loss, gradients and one SGD step against one device.

    Both runs use SDPA's math backend: DTensor has no rule for the fused CPU attention
    kernel (``_scaled_dot_product_flash_attention_for_cpu``) the plan was traced with.
    The math path builds its causal mask as a plain tensor, which
    ``implicit_replication`` lets DTensor treat as replicated.
    """
    with sdpa_kernel(SDPBackend.MATH), implicit_replication():
        return _run_case(kind, plan, input_placement, mesh)


def _run_case(kind: str, plan: Plan, input_placement: str, mesh) -> dict:
    build, input_fn = MODELS[kind]
    torch.manual_seed(0)
    model = build()
    torch.manual_seed(1)
    x = input_fn()
    ref = copy.deepcopy(model)
    ref_loss = ref(x).float().mean()
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    torch.optim.SGD(ref.parameters(), lr=0.1).step()

    pmodel = parallelize(model, plan, mesh)
    placed = {n: fmt(p.placements) for n, p in pmodel.named_parameters()}
    (xd,) = shard_inputs(x, [input_placement], mesh)
    loss = pmodel(xd).float().mean()
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    loss.backward()
    grads = full_gradients(pmodel)
    torch.optim.SGD(pmodel.parameters(), lr=0.1).step()
    stepped = {n: p.full_tensor() for n, p in pmodel.named_parameters()}
    ref_params = dict(ref.named_parameters())
    return {
        "placed": placed,
        "loss": _close(loss.detach(), ref_loss.detach()),
        "grads": {n: _close(g, ref_grads[n]) for n, g in grads.items()},
        "missing_grads": sorted(set(ref_grads) - set(grads)),
        "sgd": {n: _close(w.detach(), ref_params[n].detach()) for n, w in stepped.items()},
    }


def _check_meta(mesh) -> dict:
    """A meta TinyMLP, FSDP-placed: each rank allocates only its shard, init_fn fills it."""
    with torch.device("meta"):
        model = _mlp()
    plan = _fsdp_like_plan(model)
    seen = []

    def init_fn(m: torch.nn.Module) -> None:
        seen.append(type(m).__name__)
        for p in m.parameters():
            torch.nn.init.ones_(p)

    pmodel = parallelize(model, plan, mesh, init_fn=init_fn)
    w = pmodel.layers[0].w1.weight
    local = w.to_local()
    return {
        "init_fn": seen,
        "device": str(local.device),
        "local_shape": list(local.shape),
        "storage_bytes": local.untyped_storage().nbytes(),
        "full_ones": bool((w.full_tensor() == 1).all()),
    }


def _fsdp_like_plan(model: torch.nn.Module) -> Plan:
    """Every parameter S(0) on a 1-D mesh of 4: a hand-made plan for the meta test."""
    placed = {n: (Shard(0),) for n, _ in model.named_parameters()}
    return _hand_plan(model, placed, (WORLD,), ("dp",))


def _hand_plan(model: torch.nn.Module, placed: dict, mesh_shape, axis_names) -> Plan:
    """A Plan holding only what ``parallelize`` reads: parameter placements and shapes."""
    return Plan(
        status="optimal",
        objective_us=0.0,
        compute_us=0.0,
        comm_us=0.0,
        param_placements=placed,
        node_placements={},
        timings={},
        ilp_size={},
        mesh_shape=tuple(mesh_shape),
        axis_names=tuple(axis_names),
        param_shapes={n: tuple(p.shape) for n, p in model.named_parameters()},
    )


def _worker(rank: int, port: int, cases: list[dict], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        results = {}
        for case in cases:
            if case["kind"] == "meta":
                mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
                results[case["name"]] = _check_meta(mesh)
                continue
            plan = Plan.from_json(case["plan"])
            mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
            results[case["name"]] = _check_case(case["kind"], plan, case["input"], mesh)
        if rank == 0:
            Path(out_dir, "results.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _run(cases: list[dict], tmp_path: Path) -> dict:
    mp.spawn(_worker, args=(_free_port(), cases, str(tmp_path)), nprocs=WORLD, join=True)
    return json.loads(Path(tmp_path, "results.json").read_text())


def _assert_matches(result: dict) -> None:
    assert result["loss"][0], f"loss differs by {result['loss'][1]:.3g}"
    assert not result["missing_grads"], result["missing_grads"]
    bad = {n: d for n, (ok, d) in result["grads"].items() if not ok}
    assert not bad, f"gradients differ (max abs diff): {bad}"
    bad = {n: d for n, (ok, d) in result["sgd"].items() if not ok}
    assert not bad, f"weights after one SGD step differ (max abs diff): {bad}"


@pytest.fixture(scope="module")
def mlp_results(tmp_path_factory) -> dict:
    """The MLP cases run together: one spawn of 4 processes."""
    tight = 4 * 4 * MLP_NUMEL / WORLD / 2**30 * 1.01  # params+grads+2 Adam states, sharded 4 ways
    fsdp = _plan("mlp", (WORLD,), ("dp",), "S(0)", budget_gib=tight)
    ddp = _plan("mlp", (WORLD,), ("dp",), "S(0)")
    cases = [
        {"name": "fsdp", "kind": "mlp", "plan": fsdp.to_json(), "input": "S(0)"},
        {"name": "ddp", "kind": "mlp", "plan": ddp.to_json(), "input": "S(0)"},
        {"name": "meta", "kind": "meta"},
    ]
    return _run(cases, tmp_path_factory.mktemp("mlp"))


def test_mlp_fsdp_like_plan_matches_one_device(mlp_results):
    """A memory-tight plan shards every MLP weight; loss, grads and an SGD step match one device."""
    result = mlp_results["fsdp"]
    assert all(p.startswith("S(") for p in result["placed"].values()), result["placed"]
    _assert_matches(result)


def test_mlp_ddp_like_plan_matches_one_device(mlp_results):
    """With no budget every MLP weight is replicated; loss, grads and an SGD step match one device."""
    result = mlp_results["ddp"]
    assert set(result["placed"].values()) == {"R"}, result["placed"]
    _assert_matches(result)


def test_meta_model_is_materialized_shard_by_shard(mlp_results):
    """A meta model gets only its local shard allocated on CPU, then init_fn fills it."""
    result = mlp_results["meta"]
    assert result["init_fn"] == ["TinyMLP"]
    assert result["device"] == "cpu"
    assert result["local_shape"] == [256 // WORLD, 64]
    assert result["storage_bytes"] == 256 // WORLD * 64 * 4
    assert result["full_ones"]


# Parameter placements two memory-tight planner runs chose for tiny LLaMA on (dp=2, tp=2).
# The runs disagreed (objectives 843.6 vs 808.8 us, both reported "optimal"), so the
# placements are recorded here to keep the tests deterministic.
TIGHT_COMMON = {
    "tok_embeddings.weight": "S(1)R",
    "norm.weight": "RR",
    "output.weight": "S(0)S(0)",
} | {
    f"layers.{i}.{name}": placement
    for i in range(2)
    for name, placement in {
        "attention.wq.weight": "S(0)S(0)",
        "attention.wo.weight": "S(1)S(1)",
        "feed_forward.w1.weight": "S(0)S(0)",
        "feed_forward.w2.weight": "S(1)S(1)",
        "feed_forward.w3.weight": "S(0)S(0)",
        "attention_norm.weight": "RR",
        "ffn_norm.weight": "RR",
    }.items()
}
TIGHT_OK = TIGHT_COMMON | {
    "layers.0.attention.wk.weight": "S(0)R",
    "layers.0.attention.wv.weight": "RS(0)",
    "layers.1.attention.wk.weight": "RS(0)",
    "layers.1.attention.wv.weight": "RS(0)",
}
TIGHT_WK_4WAY = TIGHT_COMMON | {
    "layers.0.attention.wo.weight": "RR",
    **{f"layers.{i}.attention.{w}.weight": "S(0)S(0)" for i in range(2) for w in ("wk", "wv")},
}


def _llama_plan(placements: dict[str, str]) -> Plan:
    with torch.device("meta"):
        model = _llama()
    placed = {n: parse(p, 2) for n, p in placements.items()}
    return _hand_plan(model, placed, (2, 2), ("dp", "tp"))


@pytest.mark.slow
def test_tiny_llama_on_2x2_matches_one_device(tmp_path):
    """Tiny LLaMA on (dp=2, tp=2), planned and memory-tight plans: loss, grads, SGD match."""
    free = _plan("llama", (2, 2), ("dp", "tp"), "S(0)R")
    cases = [
        {"name": "free", "kind": "llama", "plan": free.to_json(), "input": "S(0)R"},
        {
            "name": "tight",
            "kind": "llama",
            "plan": _llama_plan(TIGHT_OK).to_json(),
            "input": "S(0)R",
        },
    ]
    results = _run(cases, tmp_path)
    _assert_matches(results["free"])
    _assert_matches(results["tight"])


@pytest.mark.slow
@pytest.mark.xfail(
    raises=mp.ProcessRaisedException,
    strict=True,
    reason="known gap: with wk sharded S(0)S(0) (32 rows over 4 ranks), DTensor's own "
    "propagation of wk(x).view(B, S, 2 kv heads, 16) gives an invalid local view "
    "(2 heads split 4 ways); executing the plan's node placements is the next slice",
)
def test_tiny_llama_wk_sharded_four_ways(tmp_path):
    """Tiny LLaMA with wk/wv sharded over both axes (a planner choice) runs and matches."""
    plan = _llama_plan(TIGHT_WK_4WAY)
    cases = [{"name": "llama", "kind": "llama", "plan": plan.to_json(), "input": "S(0)R"}]
    _assert_matches(_run(cases, tmp_path)["llama"])


def _unit_plan() -> tuple[torch.nn.Module, Plan]:
    with torch.device("meta"):
        model = _mlp()
    return model, _fsdp_like_plan(model)


class _FakeMesh:
    """Just enough of a DeviceMesh for the checks that run before any collective."""

    shape = (2, 2)
    ndim = 2


def test_mesh_shape_mismatch_names_both_shapes():
    """A mesh of another shape than the plan's is a ValueError naming both shapes."""
    model, plan = _unit_plan()
    with pytest.raises(ValueError, match=r"mesh shape \(2, 2\).*mesh_shape \(4,\)"):
        parallelize(model, plan, _FakeMesh())


def test_missing_and_misshapen_parameters_are_named():
    """A parameter absent from the plan, or of another shape, is a ValueError naming it."""
    model, plan = _unit_plan()
    mesh = _FakeMesh()
    mesh.shape, mesh.ndim = (WORLD,), 1
    missing = dict(plan.param_placements)
    del missing["layers.1.w2.weight"]
    with pytest.raises(ValueError, match=r"'layers\.1\.w2\.weight'.*not in the plan"):
        parallelize(model, dataclasses.replace(plan, param_placements=missing), mesh)
    shapes = dict(plan.param_shapes) | {"layers.0.w1.weight": (128, 64)}
    with pytest.raises(ValueError, match=r"'layers\.0\.w1\.weight' has shape \(256, 64\)"):
        parallelize(model, dataclasses.replace(plan, param_shapes=shapes), mesh)


@pytest.mark.parametrize("placement", ["P", "_S(0,2)"])
def test_partial_and_strided_parameters_are_not_supported_yet(placement):
    """A parameter placed Partial or _StridedShard raises NotImplementedError naming it."""
    model, plan = _unit_plan()
    mesh = _FakeMesh()
    mesh.shape, mesh.ndim = (WORLD,), 1
    placements = dict(plan.param_placements) | {"layers.0.w2.weight": parse(placement, 1)}
    with pytest.raises(NotImplementedError, match=r"'layers\.0\.w2\.weight'.*not yet supported"):
        parallelize(model, dataclasses.replace(plan, param_placements=placements), mesh)
