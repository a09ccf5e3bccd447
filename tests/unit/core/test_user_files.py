"""Files a user names: written whole or not at all, never over the command's own inputs."""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
from pathlib import Path

import pytest

from autoplan.core import user_files
from autoplan.core.errors import PlanError
from autoplan.result.plan import Plan
from autoplan.tools.chart import KINDS
from autoplan.tools.compare import write_compare

OLD = "the previous file\n"


def _plan() -> Plan:
    """A small plan made by hand: one replicated parameter on a 2-rank mesh."""
    return Plan(
        status="optimal",
        objective_us=1.0,
        compute_us=1.0,
        comm_us=0.0,
        param_placements={},
        node_placements={},
        timings={},
        ilp_size={},
        mesh_shape=(2,),
        axis_names=("dp",),
    )


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_write_replaces_the_file_whole(tmp_path):
    """write_text replaces the file's text and leaves nothing else in its folder."""
    path = tmp_path / "out.txt"
    path.write_text(OLD)
    user_files.write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert _only(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path, error):
    """A failure or Ctrl-C after part of the new text is written: the old file as it was,
    no temporary file behind."""
    path = tmp_path / "out.txt"
    path.write_text(OLD)
    with pytest.raises(type(error)), user_files.replacing(path) as tmp:
        tmp.write_text("half of the new")
        raise error
    assert path.read_text() == OLD
    assert _only(tmp_path) == ["out.txt"]


def test_a_replaced_file_keeps_its_mode_and_a_new_one_gets_the_umasks(tmp_path):
    """The new file has the old one's permissions; a first write, those open() would give."""
    path = tmp_path / "out.txt"
    path.write_text(OLD)
    path.chmod(0o640)
    user_files.write_text(path, "new\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    umask = os.umask(0)
    os.umask(umask)
    fresh = tmp_path / "fresh.txt"
    user_files.write_text(fresh, "new\n")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


def test_a_write_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    """--out naming a symlink: the file it points to gets the new text, the link stays."""
    real = tmp_path / "real.json"
    real.write_text(OLD)
    (tmp_path / "link.json").symlink_to(real)
    user_files.write_text(tmp_path / "link.json", "new\n")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new\n"
    assert _only(tmp_path) == ["link.json", "real.json"]


def test_a_write_to_a_pipe_writes_in_place(tmp_path):
    """An output that is not a regular file (a pipe, a device) is written in place: it is
    still a pipe afterwards, never replaced by a file."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    user_files.write_text(pipe, "new\n")
    reader.join(timeout=10)
    assert got == [b"new\n"] and stat.S_ISFIFO(pipe.stat().st_mode)
    assert _only(tmp_path) == ["pipe"]


def test_plan_save_failing_midway_keeps_the_previous_plan(tmp_path, monkeypatch):
    """Plan.save on a full disk (the flush fails): the plan saved before is intact and
    loads, and no temporary file is left."""
    path = tmp_path / "plan.json"
    _plan().save(path)
    before = path.read_bytes()

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(user_files.os, "fsync", full)
    changed = dataclasses.replace(_plan(), objective_us=2.0)
    with pytest.raises(OSError, match="No space"):
        changed.save(path)
    assert path.read_bytes() == before and Plan.load(path) == _plan()
    assert _only(tmp_path) == ["plan.json"]


def test_compare_chart_failing_midway_keeps_the_previous_chart(tmp_path, monkeypatch):
    """write_compare whose chart fails while drawing to disk: the previous PNG intact, no
    temporary file."""
    import matplotlib.figure

    by_kind = {k: {"compute_us": 1.0, "comm_us": 1.0} for k in KINDS}
    result = {m: {"cost_by_kind": by_kind} for m in ("einsum", "native")}
    (tmp_path / "compare.png").write_bytes(b"old chart")

    def broken(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(OSError, match="No space"):
        write_compare(result, tmp_path, "title")
    assert (tmp_path / "compare.png").read_bytes() == b"old chart"
    assert _only(tmp_path) == ["compare.json", "compare.png"]


def test_an_output_that_is_an_input_is_refused_naming_both(tmp_path):
    """refuse_overwrite names the flag, both paths and an example; other files pass."""
    run = tmp_path / "run.yaml"
    run.write_text("x")
    (tmp_path / "alias.yaml").hardlink_to(run)
    inputs = [("run file", run)]
    for out in (run, tmp_path / "alias.yaml"):
        with pytest.raises(PlanError, match=rf"--out {out}: is the run file {run}.*--out p\.json"):
            user_files.refuse_overwrite("--out", out, inputs, example="p.json")
    user_files.refuse_overwrite("--out", tmp_path / "plan.json", inputs, example="p.json")
