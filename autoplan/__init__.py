"""autoplan: an ILP-based auto-parallel planner for PyTorch.

Public API: :func:`plan` finds a sharding plan for a model over a device
mesh; :class:`Plan` holds it; :class:`PlanConfig` configures planning;
:func:`fake_mesh` makes a planning mesh of any size on one CPU.
"""

from autoplan.config import PlanConfig
from autoplan.cost.topology import Device, Topology
from autoplan.mesh import fake_mesh
from autoplan.plan import Plan
from autoplan.planner import plan

__all__ = ["Device", "Plan", "PlanConfig", "Topology", "fake_mesh", "plan"]
