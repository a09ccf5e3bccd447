"""The table `autoplan calibrate` prints: each kind's fitted figures and its median and
worst error (autoplan.calibrate.report)."""

from __future__ import annotations

from autoplan.calibrate.fit_links import FitError
from autoplan.calibrate.report import format_calibration
from autoplan.calibrate.run import Calibrated
from autoplan.core.measured import CollectiveFits, LinkFit
from autoplan.core.topology import Device, Topology


def test_the_table_names_each_fit_and_its_errors():
    """One row per kind with its figures, points, median and worst error, aligned; the
    device's name and memory last."""
    topo = Topology(
        device=Device("cpu x", 0.1, 0.05, 40.0, 5.5, 1.0, 1.0, 2.5),
        gpus_per_node=4,
        collectives=CollectiveFits(intra=(("all_reduce", LinkFit(461.7, 682.4, 0.6643)),)),
    )
    errors = {
        "intra.all_reduce": FitError(0.152, 0.866, 24),
        "overhead": FitError(0.03, 0.2, 3),
        "matmul_bf16": FitError(0.055, 0.941, 5),
    }
    lines = format_calibration(Calibrated(topo, errors, [], [], None, [])).splitlines()
    assert lines[0].split() == [
        "kind",
        "fitted",
        "figures",
        "points",
        "median",
        "err",
        "worst",
        "err",
    ]
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == [
        "intra.all_reduce", "latency_us", "461.7,", "step_us", "682.4,", "busbw_gbps", "0.6643",
        "24", "15.2", "%", "86.6", "%",
    ]  # fmt: skip
    assert lines[3].split() == ["overhead", "op_overhead_us", "2.5", "3", "3.0", "%", "20.0", "%"]
    assert lines[4].split()[:2] == ["matmul_bf16", "peak_bf16_tflops"]
    assert len({len(line) for line in lines[:5]}) == 1
    assert lines[-1] == "device: cpu x, memory_gib 5.5"
