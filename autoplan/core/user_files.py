"""The files a user names: read one as text, or write one whole, or say why not.

Input: a path, what the file should be, and how to get a good one (reading); a path and
its new contents (writing). Output: the file's UTF-8 text, or a
:class:`~autoplan.core.errors.PlanError` (of the kind the caller asks for) naming the path and
the fix: missing, a directory, unreadable, or not UTF-8 text. A write replaces the file
whole or not at all (:func:`replacing`), and :func:`refuse_overwrite` stops a command
from writing over a file it reads, and :func:`writable` checks an output path before
the work that fills it.

Why one module: every file autoplan reads or writes for a user goes through here, so
every tool fails the same clear way, and no failure (a full disk, Ctrl-C, SIGTERM) ever
leaves a truncated plan, chart or results file behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from autoplan.core.errors import PlanError


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


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A new empty file beside ``path`` for the caller to write; renamed onto ``path`` when
    the block ends, removed when it raises (an error, Ctrl-C), leaving ``path`` as it was.

    The temporary file sits in the folder of the file ``path`` leads to (through any
    symlink, which stays a link), so the rename (``os.replace``) is atomic: a reader sees
    the old file or the new one, never a part. It gets the mode the file has, or a new
    file's (0o666 less the umask), and is flushed to disk first. A ``path`` that exists
    and is not a regular file (a device such as ``/dev/stdout``, a pipe) is written in
    place: there is no file to keep whole, and a rename would replace the device itself.
    """
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        yield Path(path)
        return
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # created 0o666 under the umask, as open() creates a file
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`replacing`)."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def refuse_overwrite(
    flag: str,
    out: str | Path,
    inputs: Iterable[tuple[str, str | Path]],
    *,
    example: str | Path,
) -> None:
    """A PlanError if the output ``out`` (given as ``flag``) is one of the command's
    ``inputs`` (``(what, path)``: the run file, its topology file, a plan it reads): the
    same file under any spelling (a relative path, a symlink, a hard link). ``example``
    is an output path to suggest instead."""
    out = Path(out)
    for what, path in inputs:
        try:
            same = os.path.samefile(out, path)
        except OSError:  # either one missing: no file to overwrite
            continue
        if same:
            raise PlanError(
                f"{flag} {out}: is the {what} {path}, which this command reads; writing there "
                f"would replace it. Write to another file, e.g. {flag} {example}"
            )


def writable(path: str | Path, flag: str) -> Path:
    """``path`` a file can be written to (it may exist), or a PlanError naming ``flag``."""
    p = Path(path)
    if p.is_dir():
        raise PlanError(f"{flag} {p}: is a directory; give a file path such as {p / 'plan.json'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise PlanError(
            f"{flag} {p}: the directory {parent} does not exist; create it first "
            f"(mkdir -p {parent}) or write elsewhere"
        )
    target = p if p.exists() else parent
    if not os.access(target, os.W_OK):
        raise PlanError(f"{flag} {p}: {target} is not writable; choose a path you can write")
    return p
