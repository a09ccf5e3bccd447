"""autoplan: an ILP-based auto-parallel planner for PyTorch.

Public API: :func:`plan` finds a sharding plan for a model over a device
mesh; :class:`Plan` holds it; :class:`PlanConfig` configures planning;
every mistake in user input raises :class:`PlanError` (a ``ValueError``);
:func:`fake_mesh` makes a planning mesh of any size on one CPU;
:func:`parallelize` turns a model into one that runs a plan on a real mesh, fed by
:func:`shard_inputs`; :mod:`autoplan.runtime.checkpoint` saves and loads it under any plan;
:func:`calibrate` measures a job's devices and links into a :class:`Topology`.
"""

from autoplan.calibrate import calibrate  # the function, not the package of the same name
from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError
from autoplan.core.mesh import fake_mesh
from autoplan.core.topology import Device, Topology
from autoplan.planner.pipeline import plan
from autoplan.result.plan import Plan
from autoplan.runtime import checkpoint
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs

__all__ = [
    "Device",
    "Plan",
    "PlanConfig",
    "PlanError",
    "Topology",
    "calibrate",
    "checkpoint",
    "fake_mesh",
    "full_gradients",
    "parallelize",
    "plan",
    "shard_inputs",
]
