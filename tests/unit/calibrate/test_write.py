"""A calibrated topology file: written whole under a header, read back as the same
Topology by a run file and by ``--set topology=``, never over a file without force
(autoplan.calibrate.write)."""

from __future__ import annotations

import os

import pytest

from autoplan.calibrate.write import check_out, topology_yaml, write_topology
from autoplan.core.errors import PlanError
from autoplan.core.measured import Calibration, CollectiveFits, LinkFit
from autoplan.core.topology import Device, Topology
from autoplan.tools.cli import main
from autoplan.tools.runfile import load_run, load_topology

HEADER = ["autoplan topology measured by `autoplan calibrate` on 2026-11-27T16:00:00+00:00"]
RUN = (
    "model: {name: mlp, args: {dim: 16, hidden: 32, n_layers: 1}}\n"
    "inputs: {batch: 4, seq: 8}\nmesh: {shape: [2, 2], names: [dp, tp]}\n"
)


def _measured() -> Topology:
    """A topology as calibrate makes one: fitted figures of 4 significant digits."""
    fit = LinkFit(latency_us=461.7, step_us=682.4, busbw_gbps=0.6643)
    return Topology(
        device=Device("cpu AMD EPYC, 4 ranks per node", 0.1756, 0.08359, 44.26, 5.885,
                      1.0, 1.0, 1.641),
        gpus_per_node=4,
        intra_node_gbps=0.7839,
        nvls=False,
        collectives=CollectiveFits(
            intra=(("all_gather", fit), ("reduce_scatter", fit), ("all_reduce", fit),
                   ("all_to_all", LinkFit(432.0, 247.5, 0.7839)))
        ),
        calibration=Calibration(
            date="2026-11-27T16:13:36+00:00", torch="2.13.0+cpu", backend="gloo",
            mesh=(2, 2), names=("dp", "tp"),
            errors=(("intra.all_reduce", 0.1524), ("matmul_fp32", 0.0856)),
        ),
    )  # fmt: skip


def test_the_written_file_loads_back_as_the_same_topology(tmp_path):
    """write_topology's YAML, comment header and all, is the same Topology when loaded
    as a topology file (strict YAML: the date stays a string, the figures floats)."""
    path = write_topology(tmp_path / "cpu.yaml", _measured(), HEADER, force=False)
    text = path.read_text()
    assert text.startswith("# autoplan topology measured by `autoplan calibrate`")
    assert load_topology(str(path)) == _measured()


def test_a_run_file_and_set_topology_plan_with_the_file(tmp_path, capsys, monkeypatch):
    """`topology: cpu.yaml` in a run file and `--set topology=cpu.yaml` both give the
    calibrated topology; `autoplan plan RUN.yaml --set topology=cpu.yaml` plans with it."""
    write_topology(tmp_path / "cpu.yaml", _measured(), HEADER, force=False)
    (tmp_path / "run.yaml").write_text(RUN + "topology: cpu.yaml\n")
    assert load_run(tmp_path / "run.yaml").config.topology == _measured()
    (tmp_path / "bare.yaml").write_text(RUN)
    monkeypatch.chdir(tmp_path)  # --set names the file as a user in its folder would
    assert load_run("bare.yaml", ["topology=cpu.yaml"]).config.topology == _measured()
    assert main(["plan", "bare.yaml", "--set", "topology=cpu.yaml", "--quiet"]) == 0
    assert "estimated step" in capsys.readouterr().out


def test_an_existing_file_is_kept_unless_forced(tmp_path):
    """A file at the output path is refused by name, with the fix; with force it is
    replaced, whole, and no temporary file is left beside it."""
    path = tmp_path / "cpu.yaml"
    path.write_text("keep me\n")
    with pytest.raises(PlanError, match=r"--out .*cpu.yaml: the file exists; .* add --force"):
        write_topology(path, _measured(), HEADER, force=False)
    assert path.read_text() == "keep me\n"
    write_topology(path, _measured(), HEADER, force=True)
    assert path.read_text() == topology_yaml(_measured(), HEADER)
    assert os.listdir(tmp_path) == ["cpu.yaml"]


def test_an_unwritable_output_is_refused_before_measuring(tmp_path):
    """A directory, or a file in a missing directory, is refused naming the path."""
    with pytest.raises(PlanError, match="is a directory"):
        check_out(tmp_path, force=True)
    with pytest.raises(PlanError, match="the directory .*missing does not exist"):
        check_out(tmp_path / "missing" / "cpu.yaml", force=False)
