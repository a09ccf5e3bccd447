"""``autoplan.calibrate``: measure the job's devices and links into a topology.

Stage: a tool beside the pipeline; its output is the pipeline's ``Topology`` input.
Input: the job's ``DeviceMesh`` (``torch.distributed`` initialised, gloo or NCCL), an
optional output path, :class:`~autoplan.calibrate.settings.Settings`.
Output: the same :class:`~autoplan.core.topology.Topology` on every rank (every rank
fits the same slowest-rank medians), written by rank 0 when ``out`` is given, with
:class:`~autoplan.core.measured.Calibration` saying when, on what and how well.
Why: a plan is only as good as its prices, and a datasheet prices a GPU (and links)
that may not be the job's; measured on the job's own ranks, loaded as a step loads
them, the prices are the job's.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict, Unpack

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.calibrate.comm import CollectiveSample, measure_collectives
from autoplan.calibrate.compute import ComputeSample, measure_compute
from autoplan.calibrate.fit_device import fit_device
from autoplan.calibrate.fit_links import FitError, fit_collectives
from autoplan.calibrate.groups import mesh_groups
from autoplan.calibrate.header import header_lines
from autoplan.calibrate.settings import Settings
from autoplan.calibrate.sync import SyncSample, fit_sync, measure_sync
from autoplan.calibrate.timing import Clock
from autoplan.calibrate.write import check_out, write_topology
from autoplan.core.errors import PlanError
from autoplan.core.measured import Calibration
from autoplan.core.topology import Topology

__all__ = ["CalibrateOptions", "Calibrated", "calibrate", "cpu_model", "measure"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Calibrated:
    """A calibration's topology, every fit's error, and the samples they were fitted to."""

    topology: Topology
    errors: dict[str, FitError]
    collectives: list[CollectiveSample]
    compute: list[ComputeSample]
    sync: list[SyncSample]
    """The arrival waits measured on each group (none: a job of one rank)."""
    header: list[str]
    """The topology file's comment lines."""


class CalibrateOptions(TypedDict, total=False):
    """The keyword options :func:`calibrate` passes on to :func:`measure` (documented there,
    with their defaults)."""

    force: bool
    ranks_per_node: int | None
    settings: Settings | None
    progress: Progress | None


def calibrate(
    mesh: DeviceMesh, out: str | Path | None = None, **options: Unpack[CalibrateOptions]
) -> Topology:
    """Measure ``mesh``'s collectives and devices into a topology: :func:`measure`, with
    the same arguments, returning its topology alone, which is what a plan takes.

    Use the result as ``PlanConfig(topology=...)``, or the file written to ``out`` as
    ``topology: FILE`` in a run file.
    """
    return measure(mesh, out, **options).topology


def measure(
    mesh: DeviceMesh,
    out: str | Path | None = None,
    *,
    force: bool = False,
    ranks_per_node: int | None = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
) -> Calibrated:
    """Measure ``mesh``'s collectives and devices and fit the cost model's figures; the
    topology, every fit's error and the samples they were fitted to.

    A collective: call it on every rank of the job, whose default group ``mesh`` must
    span. ``ranks_per_node`` (default: torchrun's ``LOCAL_WORLD_SIZE``, else the whole
    job) tells a group inside one node from one across nodes. ``out``: rank 0 writes the
    topology YAML there (refused if the file exists, unless ``force``). ``settings``: what
    is measured (default: :meth:`Settings.for_device` of the mesh's device). ``progress``
    is called with each phase's name as it starts.
    """
    device = _check_job(mesh)
    if not isinstance(force, bool):
        raise PlanError(f"force ({force!r}) must be True or False.")
    per_node = _ranks_per_node(ranks_per_node)
    settings = Settings.for_device(device.type) if settings is None else settings
    if not isinstance(settings, Settings):
        raise PlanError(f"settings ({settings!r}) must be an autoplan.calibrate Settings.")
    clock = Clock(device)
    _agree_on_out(out, force, clock)
    with mesh_groups(mesh, per_node) as groups:
        links = measure_collectives(groups, settings, clock, progress)
        if progress is not None:
            progress("sync")
        sync = measure_sync(groups, settings, clock)
    compute = measure_compute(settings, clock, progress)
    if progress is not None:
        progress("fit")
    fits, errors = fit_collectives(links)
    if sync and (fits.intra or fits.inter):
        sync_us, skew = fit_sync(sync)
        fits = replace(fits, sync_us=sync_us, skew=skew)
    large = min(2 * m * k * n for _, (m, k, n), big in settings.matmul_shapes() if big)
    measured_device, device_errors = fit_device(
        compute, name=_device_name(device, per_node), memory_gib=_memory_gib(device, per_node),
        large_flops=large, host_views=device.type == "cpu",
    )  # fmt: skip
    errors |= device_errors
    when = clock.max_over_ranks([datetime.datetime.now(datetime.UTC).timestamp()])[0]
    clock.keeper.settle()
    date = datetime.datetime.fromtimestamp(round(when), datetime.UTC).isoformat()
    shape = tuple(mesh.shape)
    names = tuple(mesh.mesh_dim_names or (f"axis{a}" for a in range(len(shape))))
    # The link figures copy the highest fitted busbw: the NCCL-style model reads them only
    # for the collectives no fit covers (after a one-node calibration, those across nodes).
    busbw = {
        link: max((f.busbw_gbps for _, f in getattr(fits, link)), default=None)
        for link in ("intra", "inter")
    }
    intra, inter, default = busbw["intra"], busbw["inter"], Topology()
    topology = Topology(
        device=measured_device,
        gpus_per_node=per_node,
        nvls=device.type == "cuda" and default.nvls,  # a CPU has no NVLink SHARP
        intra_node_gbps=default.intra_node_gbps if intra is None else intra,
        inter_node_gbps=default.inter_node_gbps if inter is None else inter,
        collectives=fits if fits.intra or fits.inter else None,  # None: a job of one rank
        calibration=Calibration(
            date=date,
            torch=str(torch.__version__),
            backend=dist.get_backend(),
            mesh=shape,
            names=names,
            errors=tuple((k, round(e.median, 4)) for k, e in errors.items()),
        ),
    )
    header = header_lines(topology, settings, errors, dist.get_world_size(), out)
    if out is not None and dist.get_rank() == 0:
        if progress is not None:
            progress("write")
        write_topology(out, topology, header, force=force)
    return Calibrated(topology, errors, links, compute, sync, header)


def _check_job(mesh: DeviceMesh) -> torch.device:
    if not isinstance(mesh, DeviceMesh):
        raise PlanError(f"mesh ({mesh!r}) must be a torch.distributed DeviceMesh.")
    if not dist.is_initialized() or dist.get_backend() == "fake":
        raise PlanError(
            "calibrate measures a running job: initialise torch.distributed (gloo on CPU, "
            "nccl on GPUs; torchrun sets the environment) and pass the job's DeviceMesh, "
            "not a planning mesh (fake_mesh)."
        )
    if mesh.device_type not in ("cpu", "cuda"):
        raise PlanError(
            f"mesh.device_type ({mesh.device_type!r}) is not one calibrate measures; "
            "allowed: cpu, cuda."
        )
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ranks_per_node(given: int | None) -> int:
    world = dist.get_world_size()
    if given is None:
        local = os.environ.get("LOCAL_WORLD_SIZE")
        given = int(local) if local and local.isdigit() else world
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= world:
        raise PlanError(
            f"ranks_per_node ({given!r}) must be an int from 1 to the job's {world} ranks: "
            "the ranks on one node."
        )
    return given


def _agree_on_out(out: str | Path | None, force: bool, clock: Clock) -> None:
    """Rank 0 checks ``out`` (it writes there); every rank learns the verdict, so none
    measures alone (a collective)."""
    if out is None:
        return
    problem: PlanError | None = None
    if dist.get_rank() == 0:
        try:
            check_out(out, force=force)
        except PlanError as exc:
            problem = exc
    if clock.max_over_ranks([float(problem is not None)])[0]:
        clock.keeper.settle()
        raise problem or PlanError(f"rank 0 refused the output path {out}; see its message.")


def _device_name(device: torch.device, per_node: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {cpu_model()}, {per_node} ranks per node"


def cpu_model() -> str:
    """This machine's CPU model name (``/proc/cpuinfo`` on Linux), else what ``platform``
    knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib(device: torch.device, per_node: int) -> float:
    """A GPU's memory; a CPU's physical memory shared by the node's ranks."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / per_node
