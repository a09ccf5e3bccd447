"""The ``autoplan calibrate`` command: one process of a torchrun job.

    torchrun --nproc-per-node 4 --no-python autoplan calibrate --mesh 2x2 --names dp,tp \\
        --out cpu.yaml [--device cpu|cuda] [--force] [--quiet]

Stage: the command line around :func:`autoplan.calibrate.run.measure`.
Input: the command's options and torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, the rendezvous address).
Output: the topology file (written by rank 0), progress on stderr and the table of fits
on stdout from rank 0; a :class:`~autoplan.core.errors.PlanError` naming the option, its
value and the fix, before any process group is made, for a job it cannot measure.
Why its own module: it owns the process group it creates (gloo for ``cpu``, nccl for
``cuda``) and destroys it, whatever happens.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from autoplan.calibrate.report import format_calibration
from autoplan.calibrate.run import measure
from autoplan.calibrate.write import check_out
from autoplan.core.errors import PlanError
from autoplan.core.progress import PhaseProgress

__all__ = ["parse_mesh", "parse_names", "run_command"]

_EXAMPLE = (
    "torchrun --nproc-per-node 4 --no-python autoplan calibrate --mesh 2x2 --names dp,tp "
    "--out cpu.yaml"
)
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def parse_mesh(text: str) -> tuple[int, ...]:
    """``2x2`` -> (2, 2); ``4`` -> (4,)."""
    if not re.fullmatch(r"\s*[1-9][0-9]*(\s*x\s*[1-9][0-9]*)*\s*", text or ""):
        raise PlanError(
            f"--mesh {text!r} is not a mesh shape; write the axis sizes joined by x, "
            "e.g. --mesh 2x2 (or --mesh 4 for one axis)."
        )
    return tuple(int(s) for s in text.split("x"))


def parse_names(text: str, shape: tuple[int, ...]) -> tuple[str, ...]:
    """``dp,tp`` -> ("dp", "tp"): one distinct name per axis of ``shape``."""
    names = tuple(n.strip() for n in (text or "").split(","))
    mesh = "x".join(map(str, shape))
    if len(names) != len(shape) or not all(names):
        raise PlanError(
            f"--names {text!r} gives {len(names)} name(s) for the {len(shape)} axes of --mesh "
            f"{mesh}; give one per axis, comma-separated, e.g. --names "
            f"{','.join(('dp', 'tp', 'cp', 'ep')[: len(shape)]) if len(shape) <= 4 else 'a,b,...'}."
        )
    if len(set(names)) != len(names):
        raise PlanError(f"--names {text!r}: axis names must be distinct.")
    return names


def _job() -> tuple[int, int, int]:
    """(rank, world size, ranks per node) from torchrun's environment."""
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise PlanError(
            f"autoplan calibrate runs one process per rank under torchrun, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: start it as {_EXAMPLE}"
        )
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        text = os.environ.get(key, os.environ["WORLD_SIZE"] if key == "LOCAL_WORLD_SIZE" else "")
        if not text.isdigit():
            raise PlanError(f"{key} ({text!r}) must be a non-negative integer (torchrun sets it).")
        values[key] = int(text)
    return values["RANK"], values["WORLD_SIZE"], values["LOCAL_WORLD_SIZE"]


def run_command(
    *, mesh: str, names: str, out: str, device: str | None, force: bool, quiet: bool
) -> int:
    """Check everything that can be checked alone, then join the job, measure, write."""
    started = time.perf_counter()
    rank, world, per_node = _job()
    shape = parse_mesh(mesh)
    axis_names = parse_names(names, shape)
    if math.prod(shape) != world:
        raise PlanError(
            f"--mesh {mesh} has {math.prod(shape)} ranks but the job has {world} (WORLD_SIZE): "
            f"give a mesh of {world} ranks, or start {math.prod(shape)} processes "
            f"(torchrun --nproc-per-node {math.prod(shape)} ... on one node)."
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise PlanError(
            "--device cuda: this machine has no CUDA device torch can use "
            f"(torch {torch.__version__}, cuda {torch.version.cuda}); calibrate on the GPUs "
            "the job will run on, or give --device cpu."
        )
    if rank < per_node:  # rank 0's node sees rank 0's file system; the job checks again
        check_out(out, force=force)
    made = not dist.is_initialized()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % per_node)))
    if made:
        dist.init_process_group(BACKENDS[device])
    try:
        job_mesh = init_device_mesh(device, shape, mesh_dim_names=axis_names)
        mesh_text = " x ".join(f"{n}={k}" for n, k in zip(axis_names, shape, strict=True))
        title = (
            f"calibrate: mesh {mesh_text}, "
            f"{world} {dist.get_backend()} ranks ({per_node} per node), device {device}"
        )
        if rank != 0 or quiet:
            result = measure(job_mesh, out, force=force, ranks_per_node=per_node)
        else:
            with PhaseProgress(title) as progress:
                result = measure(
                    job_mesh, out, force=force, ranks_per_node=per_node, progress=progress
                )
    finally:
        if made:
            dist.destroy_process_group()
    if rank == 0:
        print(format_calibration(result))
        seconds = time.perf_counter() - started
        print(f"topology written to {Path(out)} in {seconds:.1f} s")
    return 0
