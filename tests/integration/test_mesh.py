"""autoplan.core.mesh.fake_mesh: a planning mesh of any size, and never at the cost of a process
group autoplan did not create."""

from __future__ import annotations

from tests.helpers.isolated import run_isolated


def test_groups_autoplan_did_not_create_are_never_destroyed():
    """In a fresh interpreter: a fake group made with torch's API is used at its own size
    and refused (PlanError) at another; a gloo group is refused and still works after."""
    seen = run_isolated("""
        import json
        import torch
        import torch.distributed as dist
        import autoplan

        seen = {}
        dist.init_process_group("fake", rank=0, world_size=4)
        users = dist.group.WORLD
        seen["same_size"] = autoplan.fake_mesh((2, 2), ("dp", "tp")).shape == (2, 2)
        try:
            autoplan.fake_mesh((8,), ("dp",))
        except autoplan.PlanError as e:
            seen["other_size"] = str(e)
        seen["fake_kept"] = dist.group.WORLD is users and dist.get_world_size() == 4
        dist.destroy_process_group()

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            autoplan.fake_mesh((1,), ("dp",))
        except autoplan.PlanError as e:
            seen["gloo"] = str(e)
        total = torch.ones(1)
        dist.all_reduce(total)
        seen["gloo_kept"] = (dist.get_backend(), float(total))
        dist.destroy_process_group()
        print(json.dumps(seen))
    """)
    assert seen["same_size"] and seen["fake_kept"]
    assert seen["other_size"].startswith("a fake process group of 4 ranks that autoplan did not")
    assert "destroy that group first" in seen["other_size"]
    assert "backend 'gloo', 1 ranks" in seen["gloo"]
    assert "pass the job's mesh to autoplan.plan" in seen["gloo"]
    assert seen["gloo_kept"] == ["gloo", 1.0]
