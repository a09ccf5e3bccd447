"""`autoplan calibrate` refuses, before it makes any process group, a job it cannot
measure: each message names the option, its value and the fix, and the exit code is 2
(autoplan.calibrate.command)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autoplan.calibrate.command import parse_mesh, parse_names
from autoplan.calibrate.settings import Settings
from autoplan.core.errors import PlanError
from autoplan.tools.cli import main

ARGS = ["calibrate", "--mesh", "2x2", "--names", "dp,tp"]


@pytest.fixture
def torchrun_env(monkeypatch):
    """The environment torchrun gives rank 0 of a 4-rank job on one node."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "4")):
        monkeypatch.setenv(key, value)
    return monkeypatch


def _groups() -> tuple:
    """The process groups this test process has (earlier tests may have made a fake one)."""
    return (
        dist.is_initialized() and dist.get_backend(),
        dist.is_initialized() and id(dist.group.WORLD),
    )


def _refused(argv, capsys) -> str:
    before = _groups()
    assert main(argv) == 2
    assert _groups() == before  # refused before it made any
    return capsys.readouterr().err


def test_not_under_torchrun(monkeypatch, capsys, tmp_path):
    """Without RANK and WORLD_SIZE it says to start it under torchrun, spelled out."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    err = _refused([*ARGS, "--out", str(tmp_path / "cpu.yaml")], capsys)
    assert "runs one process per rank under torchrun, and RANK and WORLD_SIZE are not set" in err
    assert "torchrun --nproc-per-node 4 --no-python autoplan calibrate --mesh 2x2" in err


def test_a_mesh_of_another_size_than_the_job(torchrun_env, capsys, tmp_path):
    """--mesh 2x4 in a 4-rank job: both sizes and both fixes."""
    argv = ["calibrate", "--mesh", "2x4", "--names", "dp,tp", "--out", str(tmp_path / "c.yaml")]
    err = _refused(argv, capsys)
    assert "--mesh 2x4 has 8 ranks but the job has 4 (WORLD_SIZE)" in err
    assert "give a mesh of 4 ranks, or start 8 processes" in err


def test_names_that_do_not_match_the_axes(torchrun_env, capsys, tmp_path):
    """One name for two axes: the counts and an example."""
    argv = ["calibrate", "--mesh", "2x2", "--names", "dp", "--out", str(tmp_path / "c.yaml")]
    err = _refused(argv, capsys)
    assert "--names 'dp' gives 1 name(s) for the 2 axes of --mesh 2x2" in err
    assert "e.g. --names dp,tp" in err


def test_an_existing_out_file_without_force(torchrun_env, capsys, tmp_path):
    """An existing --out is kept: the message says to choose another path or --force."""
    out = tmp_path / "cpu.yaml"
    out.write_text("mine\n")
    err = _refused([*ARGS, "--out", str(out)], capsys)
    assert f"--out {out}: the file exists; calibrate does not overwrite it" in err
    assert "add --force" in err
    assert out.read_text() == "mine\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_cuda(torchrun_env, capsys, tmp_path):
    """--device cuda on a machine without CUDA says so and offers --device cpu."""
    err = _refused([*ARGS, "--out", str(tmp_path / "c.yaml"), "--device", "cuda"], capsys)
    assert "--device cuda: this machine has no CUDA device torch can use" in err
    assert "give --device cpu" in err


def test_other_ranks_refuse_silently(torchrun_env, capsys, tmp_path):
    """Every rank refuses alike; only rank 0 prints the message."""
    torchrun_env.setenv("RANK", "2")
    argv = ["calibrate", "--mesh", "2x4", "--names", "dp,tp", "--out", str(tmp_path / "c.yaml")]
    assert _refused(argv, capsys) == ""


@pytest.mark.parametrize("text", ["2by2", "", "0x2", "2x", "x2"])
def test_a_mesh_that_is_not_a_shape(text):
    """--mesh takes positive sizes joined by x."""
    with pytest.raises(PlanError, match=rf"--mesh '{text}' is not a mesh shape.*--mesh 2x2"):
        parse_mesh(text)


def test_mesh_and_names_parse():
    """2x2 with dp,tp; a single axis; repeated names refused."""
    assert parse_mesh("2x2") == (2, 2) and parse_mesh("4") == (4,)
    assert parse_names("dp, tp", (2, 2)) == ("dp", "tp")
    with pytest.raises(PlanError, match="must be distinct"):
        parse_names("dp,dp", (2, 2))


def test_settings_are_checked():
    """A Settings field out of range names the field and its value."""
    with pytest.raises(PlanError, match=r"Settings.comm_factor \(1\) must be >= 2"):
        Settings(comm_factor=1)
    with pytest.raises(PlanError, match=r"Settings.max_repeats \(2\) must be >= min_repeats"):
        Settings(max_repeats=2)
    with pytest.raises(PlanError, match="device 'tpu' is not one calibrate measures"):
        Settings.for_device("tpu")
    assert Settings.for_device("cuda").comm_sizes()[-1] <= 256 * 2**20
