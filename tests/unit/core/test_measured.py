"""A calibrated topology: its collective fits price collectives, and its file reads back,
refused by name when corrupt or of another format (autoplan.core.measured)."""

from __future__ import annotations

import pytest
import yaml

from autoplan.core.errors import PlanError
from autoplan.core.measured import FORMAT, Calibration, CollectiveFits, LinkFit
from autoplan.core.topology import Device, Topology
from autoplan.cost.collectives import CollectiveModel, algorithm_choice, collective_time_us
from autoplan.tools.runfile import load_run

FIT = LinkFit(latency_us=100.0, step_us=20.0, busbw_gbps=2.0)


def _calibrated() -> Topology:
    return Topology(
        device=Device("cpu-4x", 0.05, 0.1, 8.0, 16.0, 1.0, 1.0, 40.0),
        gpus_per_node=4,
        collectives=CollectiveFits(
            intra=(("all_reduce", FIT), ("all_gather", FIT)), sync_us=250.0, skew=0.05
        ),
        calibration=Calibration(
            date="2026-11-27T16:00:00+00:00",
            torch="2.13.0",
            backend="gloo",
            mesh=(2, 2),
            names=("dp", "tp"),
            errors=(("intra.all_reduce", 0.04),),
        ),
    )


def test_a_fit_is_latency_plus_steps_plus_bus_bytes():
    """t = latency + step x (n - 1) + bytes x busfactor / busbw, 0 for a group of one."""
    assert FIT.time_us("all_reduce", 4e6, 4) == pytest.approx(100 + 60 + 4e6 * 1.5 / 2e3)
    assert FIT.time_us("all_gather", 4e6, 2) == pytest.approx(100 + 20 + 4e6 * 0.5 / 2e3)
    assert FIT.time_us("all_reduce", 4e6, 1) == 0.0


def test_a_measured_op_replaces_the_nccl_model_only_where_measured():
    """A fitted op on a one-node group takes its fit; an op or a link not measured keeps
    the NCCL-style price of the same topology without fits, plus the job's arrival wait."""
    topo = _calibrated()
    plain = Topology(device=topo.device, gpus_per_node=4)
    model = CollectiveModel(topo)
    # 1 MiB of float32 over 4 ranks: 2^20 divides into whole elements, no padding
    assert model.time_us("all_reduce", 2**20, 4, 1, dtype_bytes=4) == pytest.approx(
        FIT.time_us("all_reduce", 2**20, 4) + 250.0
    )
    assert algorithm_choice("all_reduce", 2**20, 4, 1, topo) == ("Measured", "fit")
    for op, p, m in (("reduce_scatter", 4, 1), ("all_reduce", 2, 2)):
        assert collective_time_us(op, 2**20, p, m, topo) == pytest.approx(
            collective_time_us(op, 2**20, p, m, plain) + 250.0
        )


def test_the_arrival_wait_is_paid_once_by_every_collective_of_two_ranks_or_more():
    """collectives.sync_us is added to each collective's time, fitted or priced by the
    NCCL-style model, once whatever its size, and not to a group of one (it waits for no one)."""
    topo = _calibrated()
    model = CollectiveModel(topo)
    for nbytes in (64, 2**24):
        assert model.time_us("all_gather", nbytes, 2, 1, dtype_bytes=4) == pytest.approx(
            FIT.time_us("all_gather", nbytes, 2) + 250.0
        )
    assert model.time_us("all_gather", 2**20, 1, 1, dtype_bytes=4) == 0.0
    plain = CollectiveModel(Topology(device=topo.device, gpus_per_node=4))
    assert model.time_us("all_to_all", 2**20, 4, 1) == pytest.approx(
        plain.time_us("all_to_all", 2**20, 4, 1) + 250.0
    )
    assert model.time_us("all_to_all", 2**20, 1, 1) == 0.0


def test_the_device_prices_compute_with_its_own_overhead_and_efficiencies():
    """Presets keep the datasheet shares (0.7, 0.8, 2 us); a device given as a mapping
    without them gets the same defaults."""
    d = Device.preset("h100")
    assert (d.flops_efficiency, d.memory_efficiency, d.op_overhead_us) == (0.7, 0.8, 2.0)
    spec = {
        "name": "x",
        "peak_bf16_tflops": 1,
        "peak_fp32_tflops": 1,
        "hbm_gbps": 1,
        "memory_gib": 1,
    }
    assert Topology.from_dict({"device": spec}).device.op_overhead_us == 2.0
    with pytest.raises(PlanError, match=r"Device.flops_efficiency \(1.5\) must be at most 1"):
        Device("x", 1.0, 1.0, 1.0, 1.0, flops_efficiency=1.5)


def test_a_calibrated_file_round_trips_through_a_run_file(tmp_path):
    """A calibrated topology written as YAML is the same Topology when a run file names it."""
    topo = _calibrated()
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(topo.to_dict(), sort_keys=False))
    run = tmp_path / "run.yaml"
    run.write_text(
        "model: {name: mlp, args: {dim: 16, hidden: 32, n_layers: 1}}\n"
        "inputs: {batch: 4}\nmesh: {shape: [2, 2], names: [dp, tp]}\ntopology: cpu.yaml\n"
    )
    assert load_run(run).config.topology == topo


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["calibration"].update(format=FORMAT + 1), r"calibration.format is 2; this autoplan reads calibration format 1"),
        (lambda d: d["calibration"].pop("format"), r"calibration.format is None"),
        (lambda d: d["collectives"]["intra"]["all_reduce"].update(busbw_gbps=0), r"all_reduce.busbw_gbps \(0\) must be > 0"),
        (lambda d: d["collectives"]["intra"]["all_reduce"].pop("step_us"), r"intra.all_reduce is missing step_us"),
        (lambda d: d["collectives"].update(nvlink={}), r"collectives: unknown key 'nvlink'; allowed: intra, inter"),
        (lambda d: d["collectives"]["intra"].update(broadcast=dict(FIT.to_dict())), r"unknown key 'broadcast'"),
        (lambda d: d["calibration"].update(mesh="2x2"), r"calibration.mesh \('2x2'\) must be a list"),
        (lambda d: d.update(collectives=[1]), r"collectives must be a mapping"),
        (lambda d: d["collectives"].update(sync_us=-1), r"collectives.sync_us \(-1\) must be >= 0"),
        (lambda d: d["collectives"].update(skew="high"), r"collectives.skew \('high'\) must be a finite number"),
        (lambda d: d["device"].update(attention_efficiency=0.0), r"attention_efficiency \(0.0\) must be > 0"),
        (lambda d: d["device"].update(view_overhead_us=-2.0), r"view_overhead_us \(-2.0\) must be >= 0"),
    ],
)  # fmt: skip
def test_a_corrupt_or_foreign_calibration_is_refused_by_name(tmp_path, edit, message):
    """A calibrated file with another format, a bad figure or an unknown key is refused,
    the message naming the file and the key."""
    d = _calibrated().to_dict()
    edit(d)
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    run = tmp_path / "run.yaml"
    run.write_text(
        "model: {name: mlp, args: {dim: 16, hidden: 32, n_layers: 1}}\n"
        "inputs: {batch: 4}\nmesh: {shape: [2, 2], names: [dp, tp]}\ntopology: cpu.yaml\n"
    )
    with pytest.raises(PlanError, match=message) as info:
        load_run(run)
    assert "cpu.yaml" in str(info.value)
