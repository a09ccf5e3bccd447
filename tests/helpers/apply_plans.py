"""The models and plans the apply tests share: the tiny MLP's plans made on fake meshes,
and hand-made plans holding only what ``parallelize`` reads."""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

import autoplan
from autoplan.models.llama3 import Transformer, tiny
from autoplan.models.mlp import TinyMLP
from autoplan.result.plan import Plan
from autoplan.tools.runfile import load_topology
from tests.helpers.planning import SLOW_DEVICES, plan_model

WORLD = 4

MLP_NUMEL = 2 * 2 * 64 * 256


def build_mlp() -> torch.nn.Module:
    return TinyMLP(dim=64, hidden=256, n_layers=2)


def build_llama() -> torch.nn.Module:
    return Transformer(tiny(2))


MODELS = {
    "mlp": (build_mlp, lambda: torch.randn(16, 32, 64)),
    # a batch of 2 on dp=2: one row per rank, so flattening it with the sequence sharded
    # on cp makes _S(0,1), which the plan may relabel S(0) at no cost
    "mlp_b2": (build_mlp, lambda: torch.randn(2, 32, 64)),
    # two rows per dp rank: the same flattening makes _S(0,2), rows interleaved
    "mlp_b4": (build_mlp, lambda: torch.randn(4, 32, 64)),
    "llama": (build_llama, lambda: torch.randint(0, 128, (8, 16))),
    # five layers: traced as four and stamped (autoplan.trace.stamp), as planned and applied
    "llama5": (lambda: Transformer(tiny(5)), lambda: torch.randint(0, 128, (8, 16))),
}

TWO_PER_NODE = dataclasses.replace(load_topology("h100"), gpus_per_node=2)


def square_loss(out: torch.Tensor) -> torch.Tensor:
    """A loss inside the graph, other than the mean: never negative, so a mix-up shows."""
    return out.float().pow(2).mean()


def fsdp_like_plan(model: torch.nn.Module) -> Plan:  # for parallelize's own checks
    """Every parameter S(0) on a 1-D mesh of 4: a hand-made plan for the meta test."""
    placed = {n: (Shard(0),) for n, _ in model.named_parameters()}
    return hand_plan(model, placed, (WORLD,), ("dp",))


def hand_plan(model: torch.nn.Module, placed: dict, mesh_shape, axis_names) -> Plan:
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


def _dp() -> DeviceMesh:
    return autoplan.fake_mesh((WORLD,), ("dp",))


def _ddp() -> Plan:
    return plan_model(*MODELS["mlp"], _dp(), input_placements=["S(0)"], topology=SLOW_DEVICES)


def _fsdp() -> Plan:
    tight = 4 * 4 * MLP_NUMEL / WORLD / 2**30 * 1.01  # params+grads+2 Adam states, sharded 4 ways
    return plan_model(*MODELS["mlp"], _dp(), input_placements=["S(0)"], memory_budget_gib=tight)


def _routes() -> Plan:
    # tp spans two nodes, cp stays inside one: S(0)R moves detour through S(0)S(0)
    return plan_model(
        *MODELS["mlp"],
        autoplan.fake_mesh((2, 2), ("tp", "cp")),
        input_placements=["S(0)R"],
        output_placements=["RR"],
        topology=TWO_PER_NODE,
        solver="highs",
    )


def _bf16() -> Plan:
    return plan_model(
        *MODELS["mlp"],
        _dp(),
        input_placements=["S(0)"],
        param_dtype="bfloat16",
        reduce_dtype="float32",
        topology=SLOW_DEVICES,
    )


def _square() -> Plan:
    # a loss other than the default, given to plan and to parallelize; a loss inside
    # the graph is replicated: nothing unpriced to read it
    return plan_model(
        *MODELS["mlp"],
        _dp(),
        input_placements=["S(0)"],
        output_placements=["R"],
        loss_fn=square_loss,
        topology=SLOW_DEVICES,
    )


_MLP_PLANS = {"fsdp": _fsdp, "ddp": _ddp, "routes": _routes, "bf16": _bf16, "square": _square}


def mlp_plans(*names: str) -> dict[str, tuple[str, Plan]]:
    """The tiny MLP's plans by case name, each as (model kind, plan): ``names`` of them, or
    all (``ddp_unbucketed`` runs the ddp plan with buckets off)."""
    made: dict[str, Plan] = {}
    out = {}
    for name in names or ("fsdp", "ddp", "ddp_unbucketed", "routes", "bf16", "square"):
        kind = "ddp" if name == "ddp_unbucketed" else name
        if kind not in made:
            made[kind] = _MLP_PLANS[kind]()
        out[name] = ("mlp", made[kind])
    return out
