"""apply.parallelize's own checks, in this process before any collective: a plan that does not
fit the mesh, the model, the graph, the batch or the loss is refused by name. The planned
model run on 4 gloo processes against one device is in tests/integration/test_apply.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

import autoplan
from autoplan.core.errors import PlanError
from autoplan.core.placements import parse
from autoplan.result.plan import Plan
from autoplan.runtime.apply import input_placements, parallelize, shard_inputs
from tests.helpers.apply_plans import (
    MODELS,
    WORLD,
    build_mlp,
    fsdp_like_plan,
    hand_plan,
    square_loss,
)
from tests.helpers.apply_plans import (
    mlp_plans as make_mlp_plans,
)


@pytest.fixture(scope="module")
def mlp_plans() -> dict[str, tuple[str, Plan]]:
    return make_mlp_plans("square", "ddp")


def test_plan_made_with_another_loss_is_refused(mlp_plans, tmp_path):
    """A plan made with a custom loss, run without it, raises naming both losses; the
    same plan and loss run (a graph is checked by its fingerprint, not by name)."""
    plan = Plan.from_json(mlp_plans["square"][1].to_json())
    mesh = autoplan.fake_mesh((WORLD,), ("dp",))
    x = torch.randn(4, 32, 64)  # a rank's shard of the planned (16, 32, 64) batch
    with pytest.raises(ValueError, match=r"made with loss_fn=tests\.helpers\.apply_plans\.square_loss.*"
                       r"loss_fn=none"):  # fmt: skip
        parallelize(build_mlp(), plan, mesh)(x)
    # the same loss name on another graph: the first node the plan lacks is named
    other = dataclasses.replace(mlp_plans["ddp"][1], loss_fn=plan.loss_fn)
    with pytest.raises(ValueError, match=r"node pow\w* \(aten\.pow\.Tensor_Scalar\) is not in"):
        parallelize(build_mlp(), other, mesh, loss_fn=square_loss)(x)


def _unit_plan() -> tuple[torch.nn.Module, Plan]:
    with torch.device("meta"):
        model = build_mlp()
    return model, fsdp_like_plan(model)


class _FakeMesh:
    """Just enough of a DeviceMesh for the checks that run before any collective."""

    shape = (2, 2)
    ndim = 2
    mesh_dim_names = None  # unnamed: taken axis by axis


def test_mesh_shape_mismatch_names_both_shapes():
    """A mesh of another shape than the plan's is a ValueError naming both shapes."""
    model, plan = _unit_plan()
    with pytest.raises(ValueError, match=r"mesh shape \(2, 2\).*mesh_shape \(4,\)"):
        parallelize(model, plan, _FakeMesh())


@pytest.mark.parametrize("names", [("tp", "dp"), ("dp", "cp")])
def test_a_mesh_with_other_axis_names_is_refused(names):
    """A plan made on (dp, tp) applied to a mesh of the same shape named otherwise (the axes
    swapped, or another axis): parallelize and shard_inputs name both and the fix."""
    with torch.device("meta"):
        model = build_mlp()
    placed = {n: (Shard(0), Replicate()) for n, _ in model.named_parameters()}
    plan = hand_plan(model, placed, (2, 2), ("dp", "tp"))
    mesh = autoplan.fake_mesh((2, 2), names)
    planned = re.escape("('dp', 'tp')")
    words = rf"named {re.escape(repr(names))}.*{planned}.*mesh_dim_names={planned}.*plan again"
    with pytest.raises(PlanError, match=words):
        parallelize(model, plan, mesh)
    with pytest.raises(PlanError, match=words):
        shard_inputs(torch.zeros(4, 32, 64), plan, mesh)
    assert isinstance(model.layers[0].w1.weight, torch.nn.Parameter)  # nothing placed
    assert not isinstance(model.layers[0].w1.weight.data, DTensor)


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


def test_plan_for_another_graph_or_batch_is_a_clear_error(mlp_plans):
    """A plan whose nodes do not match the traced graph, or a batch of another global
    shape than planned, is a ValueError that says what differs (no DTensor traceback)."""
    from autoplan.rewrite import rewrite
    from autoplan.runtime.execute import PlannedGraph
    from autoplan.runtime.planned_module import PlannedState
    from autoplan.trace.capture import trace_joint

    plan = mlp_plans["ddp"][1]
    mesh = autoplan.fake_mesh((WORLD,), ("dp",))
    traced, _ = rewrite(trace_joint(build_mlp(), MODELS["mlp"][1]), mm_mode="einsum")
    PlannedGraph(traced, plan, mesh)  # the plan's own graph fits
    nodes = {k: v for k, v in plan.node_placements.items() if k != "gelu"}
    with pytest.raises(
        ValueError, match=r"1 nodes have no planned placement \(first: \['gelu'\]\)"
    ):
        PlannedGraph(traced, dataclasses.replace(plan, node_placements=nodes), mesh)
    state = PlannedState(plan, mesh, input_placements(plan))
    with pytest.raises(
        ValueError, match=r"input 0 has global shape \(32, 32, 64\).*made for \(16, 32, 64\)"
    ):
        state.inputs([torch.randn(8, 32, 64)], {})  # a local shard of a batch of 32, not 16
    assert tuple(state.inputs([torch.randn(4, 32, 64)], {})[0].shape) == (16, 32, 64)
