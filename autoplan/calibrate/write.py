"""Writing a calibrated topology: a YAML file that says what it is, whole or not at all.

Stage: the last step of :func:`autoplan.calibrate.calibrate`.
Input: the calibrated :class:`~autoplan.core.topology.Topology`, the header's lines
(:mod:`autoplan.calibrate.header`: how it was measured, how well it fits), the output path
and ``force``.
Output: the file, written through :func:`autoplan.core.user_files.write_text` (a temporary
file renamed over the path: a reader never sees half a file), or a
:class:`~autoplan.core.errors.PlanError` before any measuring if the path is taken or cannot
be written.
Why a header: a topology file outlives the job that measured it; the comment says
when, on what and how it was measured, and which figures are not measured, so a reader
can judge whether it still describes their cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from autoplan.core.errors import PlanError
from autoplan.core.topology import Topology
from autoplan.core.user_files import writable, write_text

__all__ = ["check_out", "topology_yaml", "write_topology"]


def check_out(out: str | Path, *, force: bool, flag: str = "--out") -> Path:
    """``out`` if a topology may be written there: a writable path, and no file there
    unless ``force``."""
    path = writable(out, flag)
    if path.exists() and not force:
        raise PlanError(
            f"{flag} {out}: the file exists; calibrate does not overwrite it. Give another "
            "path, or add --force (force=True) to replace it."
        )
    return path


def topology_yaml(topology: Topology, header: Sequence[str]) -> str:
    """The topology as YAML (what :meth:`Topology.from_dict` reads) under a ``#`` header."""
    lines = [f"# {line}".rstrip() for line in header]
    body = yaml.safe_dump(topology.to_dict(), sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def write_topology(
    out: str | Path, topology: Topology, header: Sequence[str], *, force: bool
) -> Path:
    """Write the file (checked again: a file may have appeared while measuring)."""
    path = check_out(out, force=force)
    write_text(path, topology_yaml(topology, header))
    return path
