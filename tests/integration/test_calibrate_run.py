"""The real calibration on gloo ranks: a topology file that loads back, positive fits that
predict the times they were fitted to, the same on every rank (autoplan.calibrate.run,
its measuring, fitting and writing)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from autoplan.calibrate.run import measure
from autoplan.calibrate.settings import Settings
from autoplan.calibrate.sync import SyncSample, fit_sync
from autoplan.core.topology import Topology
from autoplan.cost.compute import roofline_us
from autoplan.tools.runfile import load_topology
from tests.helpers.gloo import run_workers

# Sizes and repeats cut to a few seconds of measuring; the fits see latency and bandwidth
# (up to 16 MiB: beside a busy process a 4 MiB all_to_all's bytes were under the 5 % of
# its time the fit needs to read a bandwidth).
SMALL = Settings(
    comm_min_bytes=256, comm_max_bytes=16 << 20, comm_factor=16, min_repeats=3, max_repeats=5,
    matmul_n=64, pointwise_numels=(256, 4096, 65536, 1 << 20), compute_repeats=3,
    compute_min_us=2000, cold_bytes=4 << 20, sync_repeats=5,
)  # fmt: skip


def _calibrate(rank: int, out: str, shape: list[int], names: list[str]) -> dict:
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    result = measure(mesh, out, settings=SMALL)
    topo = result.topology
    links: dict[str, list[float]] = {}
    for s in result.collectives:
        fit = topo.collectives.fit(s.op, 1)
        links.setdefault(s.op, []).append(fit.time_us(s.op, s.nbytes, s.ranks) / s.time_us)
    compute: dict[str, list[float]] = {}
    for s in result.compute:
        if s.kind == "view":
            predicted = topo.device.view_overhead_us
        else:
            predicted = roofline_us(
                topo.device,
                s.flops,
                s.nbytes,
                s.dtype != "float32",
                attention=s.kind == "attention",
            )
        compute.setdefault(s.kind, []).append(predicted / s.time_us)
    return {
        "topology": topo.to_dict(),
        "links": links,
        "compute": compute,
        "groups": sorted({(s.group, s.ranks, s.link) for s in result.collectives}),
        "errors": {k: [e.median, e.worst] for k, e in result.errors.items()},
        "sync": [[x.burst_us, x.collective_us, x.both_us] for x in result.sync],
    }


@pytest.mark.parametrize(
    "shape, names, groups",
    [
        ((2,), ("dp",), [["dp", 2, "intra"]]),
        pytest.param(
            (2, 2), ("dp", "tp"), [["dp", 2, "intra"], ["dp+tp", 4, "intra"], ["tp", 2, "intra"]],
            marks=pytest.mark.slow,
        ),
    ],
)  # fmt: skip
def test_calibrate_on_gloo_ranks(tmp_path, shape, names, groups):
    """On 2 gloo ranks (and, slow, a 2x2 mesh of 4): every rank fits the same topology;
    rank 0's file loads back as it; every figure is positive; each op's fit predicts the
    times it was fitted to within a factor of 5 at the median (a wrong unit is off by
    1000; beside a busy process a 2-rank all_reduce's fit read 0.37 at the median, so the
    bound allows that noise); each group was measured, inside one node; the arrival wait
    written is the one measured."""
    out = tmp_path / "cpu.yaml"
    world = math.prod(shape)
    results = run_workers(_calibrate, world, str(tmp_path), str(out), list(shape), list(names))
    topo = Topology.from_dict(results[0]["topology"])
    assert all(r["topology"] == results[0]["topology"] for r in results)
    assert load_topology(str(out)) == topo
    assert Path(out).read_text().startswith("# autoplan topology measured by")
    assert results[0]["groups"] == groups
    assert [op for op, _ in topo.collectives.intra] == [
        "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
    ]  # fmt: skip
    assert topo.collectives.inter == ()
    for _, fit in topo.collectives.intra:
        assert fit.busbw_gbps > 0 and fit.latency_us + fit.step_us > 0
    d = topo.device
    assert min(d.peak_fp32_tflops, d.peak_bf16_tflops, d.hbm_gbps, d.op_overhead_us) > 0
    assert (d.flops_efficiency, d.memory_efficiency, topo.gpus_per_node) == (1.0, 1.0, world)
    for op, ratios in results[0]["links"].items():
        assert 0.2 < statistics.median(ratios) < 5.0, (op, ratios)
    for kind in ("overhead", "matmul"):
        ratios = results[0]["compute"][kind]
        assert 0.2 < statistics.median(ratios) < 5.0, (kind, ratios)
    cal = topo.calibration
    assert (cal.backend, cal.mesh, cal.names, cal.torch) == (
        "gloo", shape, names, str(torch.__version__),
    )  # fmt: skip
    assert dict(cal.errors).keys() == results[0]["errors"].keys()
    # the arrival wait: on every group, after 3 lengths of compute, fitted as written
    samples = [SyncSample("g", *x) for x in results[0]["sync"]]
    assert len(samples) == 3 * len(groups)
    assert all(x.burst_us > 0 and x.collective_us > 0 for x in samples)
    sync_us, skew = fit_sync(samples)
    fits = topo.collectives
    assert (fits.sync_us, fits.skew) == (
        pytest.approx(sync_us, abs=0.1),
        pytest.approx(skew, abs=1e-4),
    )
    for kind in ("attention", "view"):
        assert 0.2 < statistics.median(results[0]["compute"][kind]) < 5.0, kind
