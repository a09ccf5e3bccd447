"""Read a file a user named (a run file, a topology, a saved plan) as text, or say why not.

Input: a path, what the file should be, and how to get a good one. Output: its UTF-8
text, or a :class:`~autoplan.errors.PlanError` (of the kind the caller asks for) naming
the path and the fix: missing, a directory, unreadable, or not UTF-8 text.
"""

from __future__ import annotations

from pathlib import Path

from autoplan.errors import PlanError


def read_text(path: str | Path, *, what: str, how: str, error: type[PlanError] = PlanError) -> str:
    """The text of the ``what`` at ``path``; ``how`` ends every message (the fix)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise error(f"{path}: no such {what}; {how}") from exc
    except IsADirectoryError as exc:
        raise error(f"{path}: is a directory, not a {what}; {how}") from exc
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc}); {how}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}), "
            f"so not a {what}; {how}"
        ) from exc
