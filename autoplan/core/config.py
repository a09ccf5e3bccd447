"""Planning options: frozen, validated dataclasses.

Input: keyword arguments (Python) or a mapping (YAML, see :mod:`autoplan.tools.runfile`).
Output: a :class:`PlanConfig` every stage reads and none mutates. Bad values
raise ``ValueError`` naming the field, the value and what is allowed.

The rules are the fields' type hints (``Annotated`` with :class:`~autoplan.core.codec.OneOf`
and :class:`~autoplan.core.codec.Limits`), checked by the codec's walk: the same walk reads
a run file's ``plan:`` section, so a value is refused alike from Python and from YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import torch

from autoplan.core.codec import Codec, Leaf, Limits, OneOf
from autoplan.core.codec_forms import PYTHON
from autoplan.core.errors import PlanError
from autoplan.core.json_errors import DecodeError
from autoplan.core.topology import Topology

MM_MODES = ("einsum", "native")
SOLVERS = ("cbc", "highs")  # the MILP solvers autoplan.ilp.backends runs
CHECKPOINT_MODES = ("none", "selective", "full")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
Positive = Annotated[float, Limits(above=0)]


@dataclass(frozen=True)
class PlanConfig:
    """How to plan."""

    NOUN = "plan"  # what the codec's messages call it: a run file's plan section

    mm_mode: Annotated[str, OneOf(MM_MODES)] = "einsum"
    """``"einsum"``: rewrite nn.Linear's view->mm->view into einsum so batch and
    sequence dims stay visible (sequence parallelism can be found).
    ``"native"``: keep mm and use DTensor's single-dim rules with
    ``_StridedShard`` variants."""
    memory_budget_gib: Positive | None = None
    """Per-device GiB for parameters + gradients + optimizer state (+ the saved
    activations and the output's gradient with ``activation_memory``); None = no limit."""
    activation_memory: bool = False
    """Count the activations the forward keeps for the backward, and the output's gradient
    the backward holds, at each strategy's local size, in ``memory_budget_gib``. Either
    way the plan reports them (``Plan.memory_breakdown``)."""
    activation_checkpointing: Annotated[str, OneOf((*CHECKPOINT_MODES, "auto"))] = "none"
    """Which activations each layer (a child of an ``nn.ModuleList``) recomputes in the
    backward instead of keeping (see :mod:`autoplan.memory.recompute`): ``"none"``;
    ``"selective"`` keeps matmul and attention outputs and recomputes the rest;
    ``"full"`` keeps the layer's input only; ``"auto"`` counts the kept activations in
    ``memory_budget_gib`` and lets the ILP choose each layer's mode with the placements
    (:mod:`autoplan.memory.layer_modes`). The recomputation is priced at the chosen placements
    and the applied module runs it."""
    optimizer_states: int = 2
    """Optimizer tensors per parameter, each the parameter's size (AdamW: 2)."""
    param_dtype: Annotated[str, OneOf(tuple(DTYPES))] | None = None
    """Mixed precision like FSDP2's MixedPrecisionPolicy: parameters are all-gathered
    and computed in this dtype (``"bfloat16"``, ``"float16"``, ``"float32"``);
    None = the model's own dtype. Master weights, gradients and optimizer state
    stay float32 and are counted at 4 bytes."""
    reduce_dtype: Annotated[str, OneOf(tuple(DTYPES))] | None = None
    """Dtype gradients are reduced in (priced at its size); None = the gradient's dtype."""
    bucket_mib: float = 25.0
    """Size cap of the buckets parameter gathers and gradient reductions run merged in
    (see :mod:`autoplan.cost.buckets`; DDP's default); 0 = one collective per move.
    The plan prices and lists the buckets; ``parallelize`` runs them."""
    solver: Annotated[str, OneOf(SOLVERS)] = "cbc"
    """MILP solver: ``"cbc"`` (ships with PuLP) or ``"highs"`` (needs highspy)."""
    time_limit_s: Positive | None = 300.0
    """Solver wall-clock limit; the best plan found so far is returned with status time_limit."""
    mip_gap: Annotated[float, Limits(below=1)] = 0.0
    """Relative optimality gap at which the solver may stop."""
    collapse_followers: bool = True
    """Merge views and pointwise ops into the node they follow before solving (see
    :mod:`autoplan.ilp.reductions.followers`): a much smaller ILP for a small loss of
    optimality."""
    stamp_layers: bool = True
    """Trace a deep stack of alike layers (one ``nn.ModuleList``) as its first four and
    stamp the second for the rest (see :mod:`autoplan.trace.stamp`): the same graph,
    several times faster. False traces every layer: for a layer whose forward branches
    on its own index (not on attributes set when it is built), which stamping cannot see."""
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
        try:
            _CHECK.check(self)
        except DecodeError as exc:
            raise PlanError(f"{exc.path} ({exc.value!r}) {exc.problem}; {exc.valid}.") from None

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


def _topology(value: Any) -> Topology:
    if not isinstance(value, Topology):
        raise ValueError(value)
    return value


_CHECK = Codec(
    {
        Topology: Leaf(
            lambda t: t.device.name,
            _topology,
            "give autoplan.Topology.preset('h100') or a Topology(...)",
            "is not an autoplan Topology",
        )
    },
    PYTHON,
)
"""The walk that checks a built PlanConfig's fields against their hints."""
