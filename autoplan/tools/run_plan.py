"""A run file planned, for the CLI, ``compare``, ``explain``, scripts and tests alike.

Input: a :class:`~autoplan.tools.runfile.Run` (a run file read and checked). Output: its
:class:`~autoplan.result.plan.Plan` (:func:`run_plan`), or the arguments that
:func:`autoplan.plan` and :func:`autoplan.planner.front_end.front_end` take for it
(:func:`run_arguments`). Why apart from :mod:`autoplan.tools.cli`: every tool that plans or
re-prices a run file builds its model, inputs, planning mesh and constraints here, so
they cannot differ; the CLI only parses arguments and prints.
"""

from __future__ import annotations

from typing import Any

from autoplan.core.mesh import fake_mesh
from autoplan.core.progress import PhaseProgress
from autoplan.planner.pipeline import plan
from autoplan.result.plan import Plan
from autoplan.tools.run_checks import mesh_text
from autoplan.tools.runfile import Run

__all__ = ["run_arguments", "run_plan"]


def run_arguments(run: Run) -> dict[str, Any]:
    """The model (on the meta device), ``input_fn``, planning mesh, config and constraints
    of ``run``, keyed as :func:`autoplan.plan` and :func:`autoplan.planner.front_end.front_end` take
    them."""
    return {
        "model": run.build_model(),
        "input_fn": run.input_fn(),
        "mesh": fake_mesh(run.mesh_shape, run.axis_names),
        "config": run.config,
        "input_placements": list(run.input_placements) or None,
        "output_placements": list(run.output_placements) or None,
        "pins": run.pins or None,
    }


def run_plan(run: Run, *, quiet: bool = False) -> Plan:
    """Plan ``run``'s model on its (fake) mesh; unless ``quiet``, show each phase on stderr."""
    if quiet:
        return plan(**run_arguments(run))
    title = (
        f"{run.source}: mesh {mesh_text(run)}, mm_mode {run.config.mm_mode}, "
        f"solver {run.config.solver}"
    )
    with PhaseProgress(title) as progress:
        return plan(**run_arguments(run), progress=progress)
