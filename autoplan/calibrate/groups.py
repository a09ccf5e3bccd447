"""The process groups a calibration measures: one per mesh axis and per run of axes.

Stage: first step of :func:`autoplan.calibrate.calibrate`.
Input: the job's ``DeviceMesh`` (a real process group) and the ranks per node.
Output: this rank's :class:`MeasuredGroup` for each axis group plans run collectives on,
with its link class (``intra``: inside one node, ``inter``: across nodes), and a
context that destroys the groups it had to create.
Why: a plan's collectives run on a single axis's group, or on the flattened group of
consecutive axes when a move gathers or reduces over several at once
(:mod:`autoplan.cost.redistribute`); those are the groups whose prices matter, and each
rank joins its own, so every group of an axis runs at once, as in a step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.core.errors import PlanError
from autoplan.core.topology import group_span

__all__ = ["MeasuredGroup", "axis_runs", "group_ranks", "measured_axes", "mesh_groups"]


@dataclass(frozen=True)
class MeasuredGroup:
    """This rank's group over some mesh axes."""

    label: str
    """The axes' names joined by ``+`` (``dp``, ``dp+tp``)."""
    axes: tuple[int, ...]
    group: dist.ProcessGroup
    ranks: int
    """Ranks in the group."""
    link: str
    """``intra`` (one node) or ``inter`` (several)."""


def axis_runs(num_axes: int) -> list[tuple[int, ...]]:
    """Each single axis, then each run of two or more consecutive axes (the whole mesh
    last): the groups a plan's collectives use."""
    runs: list[tuple[int, ...]] = [(a,) for a in range(num_axes)]
    for length in range(2, num_axes + 1):
        runs += [tuple(range(a, a + length)) for a in range(num_axes - length + 1)]
    return runs


def measured_axes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The axes of each group to measure: :func:`axis_runs` without the axes of size 1
    (a group is the same without them), each distinct set once."""
    out: list[tuple[int, ...]] = []
    for run in axis_runs(len(shape)):
        axes = tuple(a for a in run if shape[a] > 1)
        if axes and axes not in out:
            out.append(axes)
    return out


@contextlib.contextmanager
def mesh_groups(mesh: DeviceMesh, ranks_per_node: int) -> Iterator[list[MeasuredGroup]]:
    """This rank's groups over ``mesh``; the groups made here are destroyed on exit.

    The groups are :func:`measured_axes`'s. An axis's group is the mesh's own; the whole
    job is its default group; any other run (a 3-D mesh or larger) gets new groups, made
    by every rank (``new_subgroups_by_enumeration``), as ``torch.distributed`` requires.
    """
    shape = tuple(mesh.shape)
    names = mesh.mesh_dim_names or tuple(f"axis{a}" for a in range(len(shape)))
    world = dist.get_world_size()
    if mesh.size() != world:
        raise PlanError(
            f"The mesh {shape} has {mesh.size()} ranks and the job {world}: calibrate "
            "measures the whole job's mesh; build it over every rank (init_device_mesh)."
        )
    if world % ranks_per_node:
        raise PlanError(
            f"ranks_per_node ({ranks_per_node}) must divide the job's {world} ranks: it is "
            "the ranks on one node (torchrun's --nproc-per-node)."
        )
    layout = mesh.mesh.reshape(-1).tolist()
    if layout != list(range(world)):
        raise PlanError(
            f"The mesh's ranks are laid out as {layout}; calibrate (and the cost model) take "
            "them row-major, 0 to N-1, as init_device_mesh lays them out."
        )
    made: list[dist.ProcessGroup] = []
    groups = []
    try:
        for axes in measured_axes(shape):
            ranks = math.prod(shape[a] for a in axes)
            span = group_span(shape, axes, ranks_per_node)
            if len(axes) == 1:
                group = mesh.get_group(axes[0])
            elif ranks == world:
                assert dist.group.WORLD is not None, "calibrate runs in a job with a default group"
                group = dist.group.WORLD
            else:
                group, subgroups = dist.new_subgroups_by_enumeration(group_ranks(shape, axes))
                made += subgroups
            groups.append(
                MeasuredGroup(
                    label="+".join(names[a] for a in axes),
                    axes=axes,
                    group=group,
                    ranks=ranks,
                    link="intra" if span[1] == 1 else "inter",
                )
            )
        yield groups
    finally:
        for group in made:
            dist.destroy_process_group(group)


def group_ranks(shape: tuple[int, ...], axes: tuple[int, ...]) -> list[list[int]]:
    """The ranks of every group over ``axes`` of a row-major mesh of ``shape``."""
    rest = [a for a in range(len(shape)) if a not in axes]
    layout = torch.arange(math.prod(shape)).reshape(shape).permute(*rest, *axes)
    return layout.reshape(-1, math.prod(shape[a] for a in axes)).tolist()
