"""Planning options: frozen, validated dataclasses.

Input: keyword arguments (Python) or a mapping (YAML, see :mod:`autoplan.tools.runfile`).
Output: a :class:`PlanConfig` every stage reads and none mutates. Bad values
raise ``ValueError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from autoplan.core.errors import PlanError
from autoplan.core.topology import Topology

MM_MODES = ("einsum", "native")
SOLVERS = ("cbc", "highs")  # the MILP solvers autoplan.ilp.backends runs
CHECKPOINT_MODES = ("none", "selective", "full")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class PlanConfig:
    """How to plan."""

    mm_mode: str = "einsum"
    """``"einsum"``: rewrite nn.Linear's view->mm->view into einsum so batch and
    sequence dims stay visible (sequence parallelism can be found).
    ``"native"``: keep mm and use DTensor's single-dim rules with
    ``_StridedShard`` variants."""
    memory_budget_gib: float | None = None
    """Per-device GiB for parameters + gradients + optimizer state (+ the saved
    activations and the output's gradient with ``activation_memory``); None = no limit."""
    activation_memory: bool = False
    """Count the activations the forward keeps for the backward, and the output's gradient
    the backward holds, at each strategy's local size, in ``memory_budget_gib``. Either
    way the plan reports them (``Plan.memory_breakdown``)."""
    activation_checkpointing: str = "none"
    """Which activations each layer (a child of an ``nn.ModuleList``) recomputes in the
    backward instead of keeping (see :mod:`autoplan.memory.recompute`): ``"none"``;
    ``"selective"`` keeps matmul and attention outputs and recomputes the rest;
    ``"full"`` keeps the layer's input only; ``"auto"`` counts the kept activations in
    ``memory_budget_gib`` and lets the ILP choose each layer's mode with the placements
    (:mod:`autoplan.memory.layer_modes`). The recomputation is priced at the chosen placements
    and the applied module runs it."""
    optimizer_states: int = 2
    """Optimizer tensors per parameter, each the parameter's size (AdamW: 2)."""
    param_dtype: str | None = None
    """Mixed precision like FSDP2's MixedPrecisionPolicy: parameters are all-gathered
    and computed in this dtype (``"bfloat16"``, ``"float16"``, ``"float32"``);
    None = the model's own dtype. Master weights, gradients and optimizer state
    stay float32 and are counted at 4 bytes."""
    reduce_dtype: str | None = None
    """Dtype gradients are reduced in (priced at its size); None = the gradient's dtype."""
    bucket_mib: float = 25.0
    """Size cap of the buckets parameter gathers and gradient reductions run merged in
    (see :mod:`autoplan.cost.buckets`; DDP's default); 0 = one collective per move.
    The plan prices and lists the buckets; ``parallelize`` runs them."""
    solver: str = "cbc"
    """MILP solver: ``"cbc"`` (ships with PuLP) or ``"highs"`` (needs highspy)."""
    time_limit_s: float | None = 300.0
    """Solver wall-clock limit; the best plan found so far is returned with status time_limit."""
    mip_gap: float = 0.0
    """Relative optimality gap at which the solver may stop."""
    collapse_followers: bool = True
    """Merge views and pointwise ops into the node they follow before solving (see
    :mod:`autoplan.ilp.reductions.followers`): a much smaller ILP for a small loss of
    optimality."""
    cluster_layers: bool = True
    """Tie the variables of nodes that repeated identical layers make alike (see
    :mod:`autoplan.ilp.reductions.tying`): the ILP shrinks to about one layer's size."""
    untie_under_budget: bool = True
    """With ``cluster_layers`` and a memory budget the relaxation spends in full, let
    twin layers take different strategies where that is cheaper: an untied ILP runs between
    the tied LP and the tied MIP (see :mod:`autoplan.ilp.untying.untie`); never a dearer
    plan."""
    prune_dominated: bool = True
    """Drop strategies another strategy of the same node beats in compute, memory and
    every incident move before solving (see :mod:`autoplan.ilp.formulation.prune`); exact."""
    routes: bool = True
    """Price each move by its cheapest chain of DTensor redistributions through other
    placements, and run that chain when applying (see :mod:`autoplan.cost.routes`);
    false prices and runs DTensor's one-step redistribution only."""
    reduced_cost_fixing: bool = True
    """Bound the relaxation first (dual ascent, then the LP over the columns that bound
    prices near zero), round it to a plan, and give the MIP that plan as a warm start
    with every variable the bound rules out fixed to 0 (see
    :mod:`autoplan.ilp.solver.solve`); exact, and much faster under a memory budget."""
    topology: Topology = field(default_factory=Topology)
    """Devices and links the plan is priced on (default: 8x H100 per node)."""

    def __post_init__(self) -> None:
        if self.mm_mode not in MM_MODES:
            raise PlanError(f"mm_mode ({self.mm_mode!r}) must be one of {', '.join(MM_MODES)}.")
        if self.memory_budget_gib is not None and not _positive(self.memory_budget_gib):
            raise PlanError(
                f"memory_budget_gib ({self.memory_budget_gib!r}) must be a positive number "
                "of GiB, or None for no limit."
            )
        if self.activation_checkpointing not in (*CHECKPOINT_MODES, "auto"):
            raise PlanError(
                f"activation_checkpointing ({self.activation_checkpointing!r}) must be one of "
                f"{', '.join(CHECKPOINT_MODES)} or auto."
            )
        if (
            isinstance(self.optimizer_states, bool)
            or not isinstance(self.optimizer_states, int)
            or self.optimizer_states < 0
        ):
            raise PlanError(
                f"optimizer_states ({self.optimizer_states!r}) must be an int >= 0 (AdamW: 2)."
            )
        if (
            isinstance(self.bucket_mib, bool)
            or not isinstance(self.bucket_mib, (int, float))
            or not 0 <= self.bucket_mib < float("inf")
        ):
            raise PlanError(
                f"bucket_mib ({self.bucket_mib!r}) must be a number of MiB >= 0 (0: no buckets)."
            )
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise PlanError(f"{name} ({value!r}) must be one of {', '.join(DTYPES)}, or None.")
        if self.solver not in SOLVERS:
            raise PlanError(f"solver ({self.solver!r}) must be one of {', '.join(SOLVERS)}.")
        if self.time_limit_s is not None and not _positive(self.time_limit_s):
            raise PlanError(
                f"time_limit_s ({self.time_limit_s!r}) must be a positive number of seconds, "
                "or None for no limit."
            )
        if (
            isinstance(self.mip_gap, bool)
            or not isinstance(self.mip_gap, (int, float))
            or not 0 <= self.mip_gap < 1
        ):
            raise PlanError(f"mip_gap ({self.mip_gap!r}) must be in [0, 1).")
        for name in (
            "collapse_followers",
            "cluster_layers",
            "untie_under_budget",
            "prune_dominated",
            "reduced_cost_fixing",
            "routes",
        ):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"{name} ({getattr(self, name)!r}) must be true or false.")
        if not isinstance(self.topology, Topology):
            raise PlanError(f"topology ({self.topology!r}) must be an autoplan Topology.")

    @property
    def param_torch_dtype(self) -> torch.dtype | None:
        return None if self.param_dtype is None else DTYPES[self.param_dtype]

    @property
    def reduce_dtype_bytes(self) -> int | None:
        if self.reduce_dtype is None:
            return None
        return DTYPES[self.reduce_dtype].itemsize

    @property
    def counts_activations(self) -> bool:
        """Whether ``memory_budget_gib`` caps the kept activations too (``auto`` needs it
        to choose a mode)."""
        return self.activation_memory or self.activation_checkpointing == "auto"

    @property
    def memory_budget_bytes(self) -> float | None:
        return None if self.memory_budget_gib is None else self.memory_budget_gib * 2**30

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "topology"}
        out["topology"] = self.topology.device.name
        return out


def _positive(value: Any) -> bool:
    """A finite number above 0, not a bool (NaN and infinity are refused: None is the way
    to say "no limit")."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf
