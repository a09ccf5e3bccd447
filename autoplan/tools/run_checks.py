"""Checks a run file's run passes before any solve: what ``autoplan validate`` reports.

Input: a :class:`~autoplan.tools.runfile.Run` (already schema-checked) and output paths.
Output: a :class:`Checked` summary, or a :class:`~autoplan.core.errors.PlanError` naming
the key, its value and the fix. Why here: ``validate`` must refuse what ``plan``
would, and ``plan`` must refuse an unwritable ``--out``, or one that is its own run
file, before a long solve, not after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from autoplan.core.errors import PlanError
from autoplan.core.inputs import flatten_inputs
from autoplan.core.placements import Placements, fmt, is_even
from autoplan.core.user_files import refuse_overwrite
from autoplan.tools.runfile import Run


@dataclass(frozen=True)
class Checked:
    """What the checks saw: the input's shape and, when they were needed (or a summary
    was asked for), the output's and the model's parameters."""

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...] | None
    num_params: int = 0
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def mesh_text(run: Run) -> str:
    """``dp=2 x tp=2``."""
    return " x ".join(f"{n}={k}" for n, k in zip(run.axis_names, run.mesh_shape, strict=True))


def check_run(run: Run, *, summary: bool = False) -> Checked:
    """Every placement of the run file against the shape it places, on the run's mesh.

    The model is built (on the meta device) only when a pin or an output placement
    needs its shapes, or ``summary`` asks for its parameter count and shapes (validate).
    """
    with torch.device("meta"):
        x = run.input_fn()()
    keys, tensors = flatten_inputs(x, f"{run.source}'s model inputs")
    shapes = [tuple(t.shape) for t in tensors]
    _one_per_input(run, shapes)
    for i, p in enumerate(run.input_placements):  # none, or one per input
        _fits(run, f"inputs.placements[{i}]", p, shapes[i], f"input {i}")
    shape = shapes[0]
    if not (run.pins or run.output_placements or summary):
        return Checked(shape, None)
    model = run.build_model()
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, p in run.pins.items():
        if name in params:
            _fits(run, f"constraints.pin.{name}", p, params[name], "the parameter")
    out_shape = _output_shape(model, x) if run.output_placements else None
    if out_shape is not None:
        for i, p in enumerate(run.output_placements):
            _fits(run, f"constraints.output_placements[{i}]", p, out_shape, "the output")
    return Checked(shape, out_shape, sum(p.numel() for p in model.parameters()), params)


def _one_per_input(run: Run, shapes: list[tuple[int, ...]]) -> None:
    """``inputs.placements`` lists one placement per model input, or none (the solver's
    choice): the model takes the inputs ``shapes`` lists."""
    given = run.input_placements
    if not given or len(given) == len(shapes):
        return
    inputs = ", ".join(f"input {i} of shape {list(s)}" for i, s in enumerate(shapes))
    example = ", ".join(f'"{fmt(given[0])}"' for _ in shapes)
    raise PlanError(
        f"{run.source}: inputs.placements = [{', '.join(fmt(p) for p in given)}] lists "
        f"{len(given)} placements, but the model takes {len(shapes)} input"
        f"{'s' if len(shapes) != 1 else ''} ({inputs}); give one placement per input, e.g. "
        f"placements: [{example}], or leave placements out to let the planner choose."
    )


def _output_shape(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, ...] | None:
    """The output's shape from a meta-device forward, or None when that forward fails (the
    planner's trace then names what fails)."""
    with torch.device("meta"):
        try:
            out = model(x)
        except Exception:
            return None
    return tuple(out.shape) if isinstance(out, torch.Tensor) else None


def _fits(run: Run, key: str, p: Placements, shape: tuple[int, ...], what: str) -> None:
    if not is_even(shape, p, run.mesh_shape):
        raise PlanError(
            f"{run.source}: {key} = {fmt(p)} does not fit {what} of shape {list(shape)} on "
            f"mesh {mesh_text(run)}: each sharded dim must exist (below {len(shape)}) and be a "
            "multiple of the mesh axes sharding it; pick such a dim, or replicate it (R)."
        )


def not_an_input(run: Run, flag: str, out: str | Path, *, example: str | Path) -> None:
    """A PlanError if ``out`` is a file the run was read from (the run file, its topology
    file): writing there would destroy the command's own input."""
    inputs = [("run file", run.source)]
    if run.topology_file is not None:
        inputs.append(("topology file", run.topology_file))
    refuse_overwrite(flag, out, inputs, example=example)
