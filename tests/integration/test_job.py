"""Planning inside a job: on the job's own mesh, no collective, the same plan on every rank.

Four gloo processes, as ``torchrun`` starts them: each builds the job's mesh and plans
on it (every rank for itself, then with ``broadcast_from=0``); the group must still be
the job's and usable afterwards, and ``fake_mesh`` must refuse to replace it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

import autoplan
from autoplan.models.mlp import TinyMLP
from tests.helpers.gloo import run_workers
from tests.helpers.planning import plan_model

WORLD = 4


BUDGET_GIB = 4 * 4 * 8320 / 4 / 2**30


def _mlp() -> TinyMLP:
    return TinyMLP(dim=32, hidden=64, n_layers=2)


def _batch() -> torch.Tensor:
    return torch.randn(8, 16, 32)


def _in_job(rank: int) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out: dict = {}
    try:
        autoplan.fake_mesh((2, 2), ("dp", "tp"))
    except autoplan.PlanError as e:
        out["fake_mesh_error"] = str(e)
    options = {"input_placements": ["S(0)R"], "memory_budget_gib": BUDGET_GIB}
    with CommDebugMode() as comm:
        own = plan_model(_mlp, _batch, mesh, **options)
    out["collectives_while_planning"] = comm.get_total_counts()
    out["own"] = own.to_json()
    shared = plan_model(_mlp, _batch, mesh, broadcast_from=0, **options)
    out["shared"] = shared.to_json()
    out["shared_has_timings"] = bool(shared.timings)

    def fails() -> None:
        raise ValueError("no batch on this rank")

    try:
        plan_model(_mlp, fails if rank == 1 else _batch, mesh, broadcast_from=1)
    except Exception as e:
        out["failed"] = f"{type(e).__name__}: {e}"
    try:
        plan_model(_mlp, _batch, mesh["dp"], broadcast_from=0, **options)
    except ValueError as e:
        out["sub_mesh"] = str(e)
    total = torch.ones(1)
    dist.all_reduce(total)  # the job's group, still there and working
    out["backend"], out["sum"] = dist.get_backend(), float(total)
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    return run_workers(_in_job, WORLD, str(tmp_path_factory.mktemp("job")))


def test_every_rank_plans_the_same_plan_on_the_jobs_mesh_without_communicating(job):
    assert [r["collectives_while_planning"] for r in job] == [0] * WORLD
    plans = [autoplan.Plan.from_json(r["own"]) for r in job]
    assert plans[0].mesh_shape == (2, 2) and plans[0].axis_names == ("dp", "tp")
    assert plans[0].status == "optimal"
    assert len({r["own"] for r in job}) == 1


def test_broadcast_from_gives_every_rank_the_planning_ranks_plan(job):
    assert len({r["shared"] for r in job}) == 1
    assert job[0]["shared"] == job[0]["own"]
    assert all(r["shared_has_timings"] for r in job)


def test_a_failure_on_the_planning_rank_is_raised_on_every_rank(job):
    assert job[1]["failed"].startswith("PlanError: input_fn raised ValueError")
    assert "no batch on this rank" in job[1]["failed"]
    for r in (0, 2, 3):  # a user's mistake is a PlanError on every rank
        assert job[r]["failed"].startswith("PlanError: planning on rank 1 (broadcast_from=1)")
        assert "no batch on this rank" in job[r]["failed"]


def test_the_jobs_group_survives_and_fake_mesh_refuses_to_replace_it(job):
    assert [(r["backend"], r["sum"]) for r in job] == [("gloo", float(WORLD))] * WORLD
    assert all("pass the job's mesh to autoplan.plan" in r["fake_mesh_error"] for r in job)
    assert all("backend 'gloo', 4 ranks" in r["fake_mesh_error"] for r in job)


def test_broadcast_from_needs_a_mesh_of_the_whole_job(job):
    for r in job:
        assert r["sub_mesh"].startswith("broadcast_from=0 needs the mesh to span every rank")
        assert "the mesh (2,) has 2 ranks, the job 4" in r["sub_mesh"]


def test_broadcast_from_on_a_planning_mesh_plans_here(mesh8):
    # a planning mesh: this process is the only one, it plans
    plan = plan_model(_mlp, _batch, mesh8, broadcast_from=0)
    assert plan.status == "optimal"
