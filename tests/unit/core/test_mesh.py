"""autoplan.core.mesh.fake_mesh: a planning mesh of any size (that it never destroys a
process group autoplan did not create runs in a fresh interpreter, in
tests/integration/test_mesh.py)."""

from __future__ import annotations

import torch.distributed as dist

import autoplan


def test_fake_mesh_of_another_size_replaces_its_own_fake_group():
    """A second fake_mesh of another size makes a new fake group of that size."""
    autoplan.fake_mesh((2, 2), ("dp", "tp"))
    mesh = autoplan.fake_mesh((8,), ("dp",))
    assert (dist.get_backend(), dist.get_world_size()) == ("fake", 8)
    assert mesh.shape == (8,) and mesh.mesh_dim_names == ("dp",)
