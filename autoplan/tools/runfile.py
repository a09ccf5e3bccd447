"""YAML planning runs: a run file -> model, inputs, mesh and PlanConfig.

Input: a YAML path (and ``--set key.path=value`` overrides). Output: a
frozen :class:`Run`. Every mistake raises :class:`RunFileError` naming the
file, the key, the value and what is allowed; never a traceback from inside.

The ``model``, ``mesh``, ``inputs``, ``plan`` and ``constraints`` sections are read by
the codec's walk from their dataclasses (:mod:`autoplan.tools.run_sections`); what stays
here are the rules across keys (``hf`` or ``name``, axis names per axis, placements per
mesh axis, the model's longest sequence), a model's arguments (checked by its kind in
:mod:`autoplan.models.registry`) and the topology (a preset, a mapping or a file).

Schema::

    model:    {name: llama3 | moe | mlp, args: {...ModelArgs / MoEArgs / MLPArgs fields}}
              | {hf: gpt2 | llama | qwen2 | mistral, config: {...transformers config fields}}
    inputs:   {batch: int, seq: int, placements: ["S(0)R", ...]}   # seq: tokens per sample
    mesh:     {shape: [8, 8], names: [dp, tp]}
    plan:     {mm_mode, memory_budget_gib, activation_memory, activation_checkpointing,
               param_dtype, reduce_dtype, solver, time_limit_s, mip_gap,
               optimizer_states, bucket_mib, collapse_followers, stamp_layers, cluster_layers,
               untie_under_budget, prune_dominated, reduced_cost_fixing, routes}
    topology: h100 | a100 | h200 | b200 | {device: ..., gpus_per_node: ...} | path.yaml
    constraints: {output_placements: ["RR"],                         # per output tensor
                  pin: {layers.0.attention.wq.weight: "S(0)S(0)", einsum_default: "S(0)R"}}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError, RunFileError
from autoplan.core.placements import Placements, parse
from autoplan.core.topology import Topology
from autoplan.core.user_files import read_text
from autoplan.models import hf
from autoplan.models.registry import REFERENCE, model_kind
from autoplan.tools import strict_yaml
from autoplan.tools.run_sections import (
    ConstraintsSection,
    InputsSection,
    MeshSection,
    ModelSection,
    read_section,
)

SECTIONS = {"model", "inputs", "mesh", "plan", "topology", "constraints"}


@dataclass(frozen=True)
class Run:
    """Everything a planning run needs, read from one file.

    A Hugging Face model has ``model_name`` ``"hf:<kind>"`` and its config fields in
    ``model_args``.
    """

    source: str
    model_name: str
    model_args: dict[str, Any]
    batch: int
    seq: int
    input_placements: tuple[Placements, ...]
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    config: PlanConfig
    output_placements: tuple[Placements, ...] = ()
    pins: dict[str, Placements] = dataclasses.field(default_factory=dict)
    topology_file: str | None = None  # the topology YAML the run file names, if any

    @property
    def hf_kind(self) -> str | None:
        """``gpt2`` / ``llama`` / ... for a Hugging Face model, else ``None``."""
        return self.model_name.removeprefix("hf:") if self.model_name.startswith("hf:") else None

    def build_model(self) -> nn.Module:
        """The model on the meta device (no memory)."""
        try:
            return model_kind(self.model_name).build(self.model_args)
        except hf.HFConfigError as exc:
            raise RunFileError(f"{self.source}: model.config: {exc}") from exc

    def input_fn(self) -> Callable[[], torch.Tensor]:
        """Global example inputs: token ids (batch, seq) for language models, features
        (batch, seq, dim) for the MLP."""
        return model_kind(self.model_name).inputs(self.model_args, self.batch, self.seq)


def _err(source: str, key: str, value: Any, allowed: str) -> RunFileError:
    return RunFileError(f"{source}: {key} = {value!r} is not valid; {allowed}")


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str], source: str) -> dict[str, Any]:
    """``model.args.n_layers=4`` sets that key (value parsed as YAML)."""
    for item in overrides:
        if "=" not in item:
            raise RunFileError(f"--set {item!r}: write key.path=value, e.g. model.args.n_layers=4")
        path, text = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(k.strip() for k in keys):
            raise RunFileError(
                f"--set {item!r}: the key path {path!r} has an empty part; write "
                "section.key=value, e.g. plan.mm_mode=native"
            )
        node = raw
        for k in keys[:-1]:
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise RunFileError(f"--set {item!r}: {k} in {source} is not a mapping")
            node = nxt
        node[keys[-1]] = strict_yaml.load(text, f"--set {item!r}")
    return raw


def load_run(path: str | Path, overrides: Sequence[str] = ()) -> Run:
    """Read and validate a run file."""
    source = str(path)
    how = "give the path of a run file (YAML), e.g. configs/tiny.yaml"
    raw = strict_yaml.load(read_text(path, what="run file", how=how, error=RunFileError), source)
    if not isinstance(raw, dict):
        raise RunFileError(
            f"{source}: a run file is a mapping with keys {', '.join(sorted(SECTIONS))}"
        )
    raw = apply_overrides(raw, overrides, source)
    unknown = set(raw) - SECTIONS
    if unknown:  # checked after the overrides: --set mm_mode=native is a typo to report
        raise RunFileError(
            f"{source}: unknown top-level key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(SECTIONS))}"
        )
    return _parse(raw, source)


def _parse_hf(model: ModelSection, source: str) -> tuple[str, dict[str, Any]]:
    """``model: {hf: kind, config: {...}}`` -> (``"hf:kind"``, config), checked."""
    other = [k for k in ("name", "args") if getattr(model, k) is not None]
    if other:
        raise RunFileError(
            f"{source}: model.{other[0]} cannot be combined with model.hf; a Hugging Face "
            "model is described by model.hf and model.config only"
        )
    kind, config = model.hf, model.config or {}
    entry = model_kind(f"hf:{kind}")
    try:
        allowed = entry.keys()
        for k in config:
            if k not in allowed:
                raise RunFileError(
                    f"{source}: unknown key model.config.{k} for hf: {kind}; "
                    f"allowed: {', '.join(allowed)}"
                )
        entry.check(config)
    except hf.HFConfigError as exc:
        raise RunFileError(f"{source}: model.config: {exc}") from exc
    return f"hf:{kind}", config


def _parse_reference(model: ModelSection, source: str) -> tuple[str, dict[str, Any]]:
    """``model: {name: llama3 | moe | mlp, args: {...}}`` -> (name, args), checked."""
    if model.config is not None:
        raise RunFileError(
            f"{source}: model.config belongs to a Hugging Face model (model.hf); "
            "a reference model takes model.name and model.args"
        )
    name, args = model.name or "llama3", model.args or {}
    kind = REFERENCE[name]
    allowed = kind.keys()
    for k in args:
        if k not in allowed:
            raise RunFileError(
                f"{source}: unknown key model.args.{k}; allowed: {', '.join(allowed)}"
            )
    try:
        kind.check(args)
    except PlanError as exc:
        raise RunFileError(f"{source}: model.args: {exc}") from exc
    return name, args


def _parse(raw: dict[str, Any], source: str) -> Run:
    model = read_section(raw, "model", ModelSection, source)
    if model.hf is not None:
        name, args = _parse_hf(model, source)
    else:
        name, args = _parse_reference(model, source)

    mesh = read_section(raw, "mesh", MeshSection, source)
    if not mesh.shape:
        raise _err(source, "mesh.shape", [], "expected a list of axis sizes, e.g. [8, 8]")
    if len(mesh.names) != len(mesh.shape):
        raise _err(
            source, "mesh.names", list(mesh.names),
            f"expected {len(mesh.shape)} axis names, e.g. [dp, tp]",
        )  # fmt: skip
    if len(set(mesh.names)) != len(mesh.names):
        raise _err(source, "mesh.names", list(mesh.names), "axis names must be distinct")

    inputs = read_section(raw, "inputs", InputsSection, source)
    found = model_kind(name).seq_limit(args)
    if found is not None and inputs.seq > found[0]:
        limit, what, key = found
        raise _err(
            source,
            "inputs.seq",
            inputs.seq,
            f"at most {limit}, {what} ({key}); raise {key.rpartition('.')[2]} or shorten seq",
        )
    num_axes = len(mesh.shape)
    placements = _placements(source, "inputs.placements", inputs.placements, num_axes)

    topology = load_topology(raw.get("topology"), source)
    config = dataclasses.replace(read_section(raw, "plan", PlanConfig, source), topology=topology)
    constraints = read_section(raw, "constraints", ConstraintsSection, source)
    outputs = _placements(
        source, "constraints.output_placements", constraints.output_placements, num_axes
    )
    if len(outputs) > 1:
        raise _err(
            source, "constraints.output_placements", list(constraints.output_placements or ()),
            "the planned loss is one tensor: give one placement, e.g. [RR]",
        )  # fmt: skip
    pins: dict[str, Placements] = {}
    for key, spec in (constraints.pin or {}).items():
        pins[key] = _placement(source, f"constraints.pin.{key}", spec, num_axes)
    topology_file = _topology_file(raw.get("topology"), source)
    return Run(
        source, name, args, inputs.batch, inputs.seq, placements, mesh.shape, mesh.names,
        config, outputs, pins, None if topology_file is None else str(topology_file),
    )  # fmt: skip


def _placement(source: str, key: str, spec: str, num_axes: int) -> Placements:
    try:
        return parse(spec, num_axes)
    except ValueError as exc:
        raise RunFileError(f"{source}: {key}: {exc}") from exc


def _placements(
    source: str, key: str, specs: tuple[str, ...] | None, num_axes: int
) -> tuple[Placements, ...]:
    return tuple(_placement(source, key, s, num_axes) for s in specs or ())


def _topology_file(value: Any, source: str) -> Path | None:
    """The topology YAML ``value`` names (a path, else beside the run file ``source``), or
    None for a preset or a mapping."""
    if not (isinstance(value, str) and value.endswith((".yaml", ".yml"))):
        return None
    path = Path(value)
    if not path.is_absolute() and not path.exists():
        path = Path(source).parent / value
    return path


def load_topology(value: Any, source: str = "--topology") -> Topology:
    """A topology from a preset name, a mapping, or a topology YAML path."""
    if value is None:
        return Topology()
    try:
        path = _topology_file(value, source)
        if path is not None:
            how = "give a preset name (h100, a100, ...) or the path of a topology YAML"
            raw = strict_yaml.load(read_text(path, what="topology file", how=how), str(path))
            return Topology.from_dict(raw, source=str(path))
        if isinstance(value, str):
            return Topology.preset(value)
        if isinstance(value, dict):
            return Topology.from_dict(value, source=source)
    except (OSError, ValueError) as exc:
        raise RunFileError(f"{source}: topology: {exc}") from exc
    raise _err(source, "topology", value, "expected a preset name, a mapping or a .yaml path")
