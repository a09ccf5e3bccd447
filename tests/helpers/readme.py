"""The README's text and the ``autoplan`` command lines of its code blocks."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO

README = (REPO / "README.md").read_text()


def command_lines(text: str) -> list[str]:
    """The ``autoplan`` command lines of ``text``'s code blocks: a block of commands only
    (every line ``autoplan ...``), or the ``$ autoplan ...`` lines of a shell session.
    Blocks of output (``autoplan plan  mesh: ...`` above a summary) are not commands."""
    lines = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
        rows = [r for r in block.splitlines() if r.strip()]
        if any(r.startswith("$ ") for r in rows):
            lines += [r[2:] for r in rows if r.startswith("$ autoplan ")]
        elif rows and all(r.startswith("autoplan ") for r in rows):
            lines += rows
    return lines
