"""benchmarks/RESULTS.md holds one section per benchmark script; each rewrites its own.

A section sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; a script that
finds none appends its section at the end.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from autoplan.core.user_files import write_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def write_section(path: Path | str, name: str, text: str) -> None:
    """Replace section ``name`` of ``path`` with ``text`` (append it when absent)."""
    path = Path(path)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else ""
    if start in old and end in old:
        head, rest = old.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block
    write_text(path, new)


def header(title: str, script: str, machine: str, setup: str) -> list[str]:
    """A section's first lines: its title, the command that wrote it (this process's
    arguments to ``scripts/<script>``) and the machine (``machine``, its CPUs, Python and
    torch), ``setup`` after them."""
    cmd = " ".join([f"python scripts/{script}", *sys.argv[1:]])
    return [
        f"# {title}",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {machine}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}; {setup}",
    ]
