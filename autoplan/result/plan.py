"""The plan: the solver's answer as placements people and ``parallelize`` can read.

Input: built by :func:`autoplan.planner.pipeline.plan`. Output: a frozen :class:`Plan`
of typed records (:mod:`autoplan.result.records`) that prints a summary and saves to /
loads from JSON exactly: the file is written and read by one codec walking the same
types (:data:`autoplan.result.records.CODEC`; placements in DTensor's short form,
``S(0)R``), and a load checks what spans fields (:mod:`autoplan.result.plan_check`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from autoplan.core import user_files
from autoplan.core.codec import OneOf
from autoplan.core.config import CHECKPOINT_MODES
from autoplan.core.errors import PlanError
from autoplan.core.placements import Placements, fmt
from autoplan.result.plan_check import read_plan, read_text
from autoplan.result.records import (
    BREAKDOWN_KEYS,
    CODEC,
    MEMORY_CATEGORIES,
    STATUSES,
    Bucket,
    CommTotal,
    Cost,
    NodePlacement,
    SharedKind,
    Signed,
    Size,
    Slot,
)

PHASES = ("trace", "rewrite", "strategies", "cost", "recompute", "ilp_build", "solve", "buckets")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A sharding plan for one model on one mesh: the solution, its report and where it
    comes from.

    The solution: ``param_placements`` maps a parameter FQN to one placement per mesh
    axis; ``node_placements`` maps a graph node to its :class:`NodePlacement` (op, output
    and input placements). ``routes`` the input moves that run as a chain of
    redistributions (:mod:`autoplan.cost.routes`), keyed by the node's tensor input
    (:class:`Slot`, ``"node:slot"`` in the file), each with the placements the tensor
    passes between its producer's and the node's. ``buckets`` lists the collectives of
    ``comm`` that run merged (:class:`Bucket`, :mod:`autoplan.cost.buckets`), and a move
    the objective charged a share of a launch that runs alone, as a bucket of one.
    ``checkpointing`` maps each layer to its activation-checkpointing mode and
    ``recompute`` lists the forward nodes the backward computes again
    (:mod:`autoplan.memory.recompute`).

    The report: ``timings`` gives seconds per phase (not saved: see :meth:`to_json`);
    ``ilp_size`` the solver's variables and constraints; ``comm`` the priced collectives
    by kind (:class:`CommTotal`); ``memory_bytes`` the per-device bytes the memory budget
    caps: parameters, gradients and optimizer state, and the activations kept for the
    backward and the output's gradient when the budget counts them
    (``PlanConfig.activation_memory``, or ``activation_checkpointing="auto"``).
    ``memory_breakdown`` splits a device's peak bytes into ``parameters``,
    ``gradients``, ``optimizer``, ``activations`` (the returned output among them),
    ``output_grad`` (the output's gradient the backward holds,
    :func:`autoplan.memory.activations.cotangent_memory`) and ``transient``, the
    backward's peak beyond them (:func:`autoplan.memory.activations.backward_peak`).
    ``bound_us`` is the solver's proven lower bound on the step time (of plans with tied
    twins when the plan splits some, see ``message``; None when there is none) and
    :attr:`gap` the plan's distance above it: at most ``mip_gap`` for an ``optimal`` plan.
    ``shared_launches`` lists the bucket kinds (``head`` or ``tail``, collective, mesh
    axes) whose moves the objective charged a share of their bucket's launch
    (:mod:`autoplan.planner.bucket_search`); empty: one launch per move.

    Where it comes from: the mesh, the config, the parameters' and inputs' shapes.
    ``loss_fn`` names the loss the graph was traced with (``"mean"``: the default) and
    ``graph_fingerprint`` is the digest of that graph
    (:func:`autoplan.core.graph.fingerprint`), which ``parallelize`` compares with its own
    trace; empty in plans saved before it was recorded. ``input_shapes`` and
    ``input_keys`` give each input's global shape and its position or keyword
    (:mod:`autoplan.core.inputs`), in the graph's input order; plans saved before keys
    were recorded have none (positional inputs).
    """

    NOUN: ClassVar[str] = "plan"

    # the solution
    status: Annotated[str, OneOf(STATUSES)]
    param_placements: dict[str, Placements]
    node_placements: dict[str, NodePlacement]
    routes: dict[Slot, tuple[Placements, ...]] = field(default_factory=dict)
    buckets: list[Bucket] = field(default_factory=list)
    checkpointing: dict[str, Annotated[str, OneOf(CHECKPOINT_MODES)]] = field(default_factory=dict)
    recompute: list[str] = field(default_factory=list)
    # the report
    objective_us: Cost
    compute_us: Cost
    comm_us: Cost
    bound_us: Signed | None = None
    shared_launches: tuple[SharedKind, ...] = ()
    comm: dict[str, CommTotal] = field(default_factory=dict)
    memory_bytes: float = 0.0
    memory_breakdown: dict[Annotated[str, OneOf(BREAKDOWN_KEYS)], float] = field(
        default_factory=dict
    )
    timings: dict[str, float] = field(default_factory=dict, compare=False)  # wall clock
    ilp_size: dict[str, int]
    graph_nodes: int = 0
    solver: str = "cbc"
    message: str = ""
    stats: dict[str, Signed] = field(default_factory=dict)
    fallback_ops: tuple[str, ...] = ()
    # where it comes from
    mesh_shape: tuple[Size, ...]
    axis_names: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_shapes: tuple[tuple[int, ...], ...] = ()
    input_keys: tuple[int | str, ...] = ()
    loss_fn: str = "mean"
    graph_fingerprint: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise PlanError(f"Plan.status ({self.status!r}) must be one of {', '.join(STATUSES)}.")

    def collective_counts(self, *, bucketed: bool = True) -> dict[str, int]:
        """Collectives per kind one step runs: merged as ``buckets`` says, or one per
        priced move (``bucketed=False``, as ``parallelize(..., bucket_mib=0)`` runs)."""
        counts = {kind: c.count for kind, c in self.comm.items()}
        for b in self.buckets if bucketed else ():
            counts[b.kind] -= b.members - 1
        return counts

    def _memory_line(self) -> str:
        b = self.memory_breakdown
        if not b:  # a plan saved before the breakdown was recorded
            return f"memory per device (params+grads+optimizer): {_bytes(self.memory_bytes)}"
        parts = " + ".join(
            f"{label} {_bytes(b[key])}" for key, label, _ in MEMORY_CATEGORIES if key in b
        )
        counted = "params, grads, optimizer" + (
            ", activations"
            if self.config.get("activation_memory")
            or self.config.get("activation_checkpointing") == "auto"
            else ""
        )
        return (
            f"memory per device: {parts} = peak {_bytes(sum(b.values()))} (a budget caps {counted})"
        )

    # -- JSON -------------------------------------------------------------------

    def to_json(self, *, timings: bool = False) -> str:
        """The plan as JSON: sorted keys, floats in ``repr`` form, ``null`` for a cost an
        infeasible plan does not have (strict JSON has no NaN).

        The wall-clock seconds per phase are the one field that differs between
        two runs of the same planning problem, so they are left out unless
        ``timings=True``: :meth:`save` writes the default form, and planning a
        run file twice writes byte-identical files.
        """
        d = CODEC.encode(self, Plan)
        if not timings:
            del d["timings"]
        return json.dumps(d, indent=1, sort_keys=True, allow_nan=False)

    def save(self, path: str | Path) -> None:
        """Write the deterministic JSON (no timings); :meth:`load` reads it back. The file
        is replaced whole or not at all (:func:`autoplan.core.user_files.replacing`)."""
        user_files.write_text(path, self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str, *, source: str = "<json>") -> Plan:
        """The plan in ``text``, read by the codec that wrote it and checked across fields
        (:mod:`autoplan.result.plan_check`); a :class:`~autoplan.core.errors.PlanError`
        naming ``source``, the key and the fix if not."""
        return read_plan(cls, text, source=source)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The plan saved at ``path`` (:meth:`save`), checked as :meth:`from_json` does; a
        file that cannot be read (missing, a directory, not UTF-8) is a PlanError too."""
        return read_plan(cls, read_text(path), source=str(path), out=str(path))

    # -- reading ------------------------------------------------------------------

    @property
    def gap(self) -> float:
        """``(objective - bound) / objective``; nan without a bound (or a plan)."""
        if self.bound_us is None or not self.objective_us:
            return math.nan
        return max(0.0, (self.objective_us - self.bound_us) / abs(self.objective_us))

    @property
    def estimated_step_us(self) -> float:
        """The step ``parallelize`` runs, as priced: the objective with the plan's buckets
        (each bucket's collectives run as one)."""
        return self.objective_us - sum(b.us_alone - b.us for b in self.buckets)

    def summary(self) -> str:
        """Timings, ILP size, status, objective split and parameter placements by kind."""
        mesh = " x ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape, strict=True))
        lines = [f"autoplan plan  mesh: {mesh}  mm_mode: {self.config.get('mm_mode', '?')}"]
        if self.timings:
            lines.append(
                "phases (s):  "
                + "  ".join(f"{p} {self.timings[p]:.2f}" for p in PHASES if p in self.timings)
                + f"  total {sum(self.timings.values()):.2f}"
            )
        lines.append(
            f"graph: {self.graph_nodes} nodes, {self.ilp_size.get('merged', 0)} merged into producers, "
            f"{self.ilp_size.get('tied', 0)} tied to a twin{_split(self.ilp_size)}   "
            f"ILP: {self.ilp_size.get('variables', 0)} "
            f"variables, {self.ilp_size.get('constraints', 0)} constraints   "
            f"solver: {self.solver} -> {self.status}"
            + (f" (gap {self.gap:.3%})" if math.isfinite(self.gap) else "")
        )
        if self.message:
            lines.append(self.message)
        if self.status == "infeasible":
            return "\n".join(lines)
        lines.append(
            f"estimated step: {self.objective_us / 1e3:.2f} ms = compute {self.compute_us / 1e3:.2f} ms"
            f" + comm {self.comm_us / 1e3:.2f} ms"
            + (
                f" ({self.estimated_step_us / 1e3:.2f} ms with the buckets below)"
                if self.buckets
                else ""
            )
        )
        lines.append(self._memory_line())
        if any(mode != "none" for mode in self.checkpointing.values()):
            modes = sorted(set(self.checkpointing.values()))
            lines.append(
                f"activation checkpointing: {', '.join(modes)} in {len(self.checkpointing)} "
                f"layers, {len(self.recompute)} values recomputed in the backward"
            )
        if self.comm:
            lines.append("collectives:")
            for kind, c in sorted(self.comm.items(), key=lambda kv: -kv[1].us):
                lines.append(
                    f"  {kind:<15} x{c.count:<5} {c.bytes / 2**20:12.1f} MiB  {c.us / 1e3:9.3f} ms"
                )
        merged: dict[str, list[float]] = {}
        for b in self.buckets:  # per kind: moves, buckets, their own and merged price
            row = merged.setdefault(b.kind, [0, 0, 0.0, 0.0])
            row[0] += b.members
            row[1] += 1
            row[2] += b.us_alone
            row[3] += b.us
        for kind, (moves, buckets, alone, us) in merged.items():
            lines.append(
                f"  bucketed: {int(moves)} {kind} moves run as {int(buckets)} collectives "
                f"({alone / 1e3:.3f} ms charged -> {us / 1e3:.3f} ms; plan.buckets lists them)"
            )
        if self.routes:
            lines.append(
                f"routed moves: {len(self.routes)} inputs move through other placements on the way "
                "(plan.routes; autoplan explain shows each)"
            )
        lines.append("parameter placements (" + ", ".join(self.axis_names) + "):")
        for kind, counts in param_groups(self.param_placements).items():
            placed = ", ".join(f"{p} x{c}" if c > 1 else p for p, c in counts.most_common())
            lines.append(f"  {kind:<28} {placed}")
        if self.fallback_ops:
            lines.append("replicated (no sharding rule): " + ", ".join(self.fallback_ops))
        return "\n".join(lines)


def _split(ilp_size: dict[str, int]) -> str:
    split = ilp_size.get("untied", 0)
    if not split:
        return ""
    return f" ({split} twin class{'es' if split > 1 else ''} split under the memory budget)"


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def param_kind(fqn: str) -> str:
    """``layers.3.attention.wq.weight`` -> ``attention.wq``; ``tok_embeddings.weight`` -> ``tok_embeddings``."""
    parts = [p for p in fqn.split(".") if not re.fullmatch(r"\d+", p)]
    if parts and parts[0] == "layers":
        parts = parts[1:]
    if parts and parts[-1] in ("weight", "bias"):
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts) or fqn


def param_groups(placements: dict[str, Placements]) -> dict[str, Counter[str]]:
    """Placements counted per parameter kind, in first-seen order."""
    groups: dict[str, Counter[str]] = defaultdict(Counter)
    for fqn, p in placements.items():
        groups[param_kind(fqn)][fmt(p)] += 1
    return dict(groups)
