"""autoplan: an ILP-based auto-parallel planner for PyTorch.

Public API: :func:`plan` finds a sharding plan for a model over a device
mesh; :class:`Plan` holds it; :class:`PlanConfig` configures planning;
every mistake in user input raises :class:`PlanError` (a ``ValueError``);
:func:`fake_mesh` makes a planning mesh of any size on one CPU;
:func:`parallelize` turns a model into one that runs a plan on a real mesh, fed by
:func:`shard_inputs`; :mod:`autoplan.checkpoint` saves and loads it under any plan;
:func:`calibrate` measures a job's devices and links into a :class:`Topology`.
"""

from autoplan import checkpoint
from autoplan.apply import full_gradients, parallelize, shard_inputs
from autoplan.calibrate import calibrate  # the function, not the package of the same name
from autoplan.config import PlanConfig
from autoplan.cost.topology import Device, Topology
from autoplan.errors import PlanError
from autoplan.mesh import fake_mesh
from autoplan.plan import Plan
from autoplan.planner import plan

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
