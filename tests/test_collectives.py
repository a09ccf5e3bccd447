"""Tests for autoplan.cost.collectives: NCCL-style collective times and bus bandwidths."""

import dataclasses

import pytest

from autoplan.cost.collectives import (
    OPS,
    CollectiveModel,
    algorithm_choice,
    bus_bandwidth_gbps,
    collective_table,
    collective_time_us,
)
from autoplan.cost.topology import Topology

KiB, MiB, GiB = 2**10, 2**20, 2**30
H100 = Topology.preset("h100")
H100_NO_NVLS = dataclasses.replace(H100, nvls=False)
SHAPES = [(2, 1), (8, 1), (4, 2), (1, 8), (8, 2), (8, 16), (8, 64)]  # (ranks per node, nodes)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cost_rises_with_bytes(op, shape):
    """Time strictly grows with the message size, from 1 KiB to 4 GiB."""
    model = CollectiveModel(H100)
    sizes = [KiB * 2**k for k in range(23)] + [3 * MiB + 17, 5 * GiB]
    times = [model.time_us(op, s, *shape) for s in sorted(sizes)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize("op", OPS)
def test_group_of_one_costs_nothing(op):
    """One rank (or zero bytes) needs no communication: time 0, bus bandwidth 0."""
    assert collective_time_us(op, GiB, 1, 1, H100) == 0.0
    assert collective_time_us(op, 0, 8, 2, H100) == 0.0
    assert CollectiveModel(H100).time_us(op, GiB, 1, 1) == 0.0
    assert bus_bandwidth_gbps(op, GiB, 1, 0.0) == 0.0


@pytest.mark.parametrize("topology", [H100, H100_NO_NVLS, Topology.preset("a100")])
@pytest.mark.parametrize("shape", SHAPES)
def test_all_reduce_beats_reduce_scatter_plus_all_gather(topology, shape):
    """At large sizes an all_reduce costs less than the reduce_scatter + all_gather it fuses."""
    model = CollectiveModel(topology)
    for size in (64 * MiB, GiB, 4 * GiB):
        fused = model.time_us("all_reduce", size, *shape)
        split = model.time_us("reduce_scatter", size, *shape) + model.time_us(
            "all_gather", size, *shape
        )
        assert fused < split


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [KiB, MiB, 256 * MiB])
def test_crossing_nodes_costs_more(op, size):
    """For the same rank count, spreading the group over more nodes only costs more."""
    model = CollectiveModel(H100)
    for ladder in ([(8, 1), (4, 2), (2, 4), (1, 8)], [(8, 2), (4, 4), (2, 8), (1, 16)]):
        times = [model.time_us(op, size, p, m) for p, m in ladder]
        assert all(a < b for a, b in zip(times, times[1:], strict=False)), (ladder, times)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("shape", SHAPES)
def test_ll_wins_tiny_messages_and_simple_large_ones(op, shape):
    """LL's low latency wins at 1 KiB; Simple's full bandwidth wins at 16 GiB."""
    # A ring's latency grows with its length: over 512 ranks LL128 holds on up to
    # about 4 GiB before Simple's 8% more bandwidth pays for its longer latency.
    assert algorithm_choice(op, KiB, *shape, H100)[1] == "LL"
    assert algorithm_choice(op, 16 * GiB, *shape, H100)[1] == "Simple"


def test_algorithm_choice_follows_nccl():
    """NVLS wins large one-node all_reduce, NVLS-Tree on two nodes; gathers run on Ring."""
    assert algorithm_choice("all_reduce", GiB, 8, 1, H100) == ("NVLS", "Simple")
    assert algorithm_choice("all_reduce", GiB, 8, 2, H100) == ("NVLSTree", "Simple")
    assert algorithm_choice("all_reduce", GiB, 8, 1, H100_NO_NVLS) == ("Ring", "Simple")
    assert algorithm_choice("all_gather", GiB, 8, 4, H100)[0] == "Ring"
    assert algorithm_choice("all_to_all", GiB, 8, 4, H100) == ("Pairwise", "Simple")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_one_fused_collective_pays_latency_once(op, shape):
    """One collective of S bytes is cheaper than k back-to-back ones of S/k on the same group."""
    model = CollectiveModel(H100)
    for size in (KiB * 64, MiB, 64 * MiB, GiB):
        for k in (2, 4):
            assert model.time_us(op, size, *shape) < k * model.time_us(op, size // k, *shape)


def test_fused_all_gather_over_64_ranks_beats_intra_then_inter_split():
    """Bandwidth-bound: one 8x8 all_gather beats gathering in-node then across 8 nodes."""
    # The split's second step sends the whole buffer through every GPU's NIC:
    # eight times the network traffic of the fused ring.
    model = CollectiveModel(H100)
    for size in (16 * MiB, 256 * MiB, 4 * GiB):
        fused = model.time_us("all_gather", size, 8, 8)
        split = model.time_us("all_gather", size // 8, 8, 1) + model.time_us(
            "all_gather", size, 1, 8
        )
        assert fused < split


def test_fused_ring_pays_each_hop():
    """Latency-bound: a 64-rank ring takes 63 hops, so at 1 KiB two 7-hop rings are cheaper."""
    # NCCL's model charges latency per ring step, not once per collective; only the
    # base (launch) latency is paid once. Tree, NVLS (and NCCL's PAT) exist for this regime.
    model = CollectiveModel(H100)
    fused = model.time_us("all_gather", KiB, 8, 8)
    split = model.time_us("all_gather", KiB // 8, 8, 1) + model.time_us("all_gather", KiB, 1, 8)
    assert split < fused


# Published nccl-tests all_reduce bus bandwidth (GB/s) at >= 64 MiB, and the hardware measured.
# Honesty note: RAMP_BYTES was fitted to the Azure H100 curve, NVLS_EFFICIENCY to NVIDIA's
# "~480 busbw / ~275 algbw" (nccl-tests#212) and NET_EFFICIENCY to the #1221 and #812 figures, so
# those rows guard the calibration. The H200 curve and the Ring row (#1455, predicted from NCCL's
# own 20.6 GB/s per NVLink) were not used to set any constant.
AZURE_H100 = (
    "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_H100_v5_results.md "
    "'NCCL Bandwidth': Azure ND H100 v5, 8x H100 SXM 80GB (NVLink4/NVSwitch), NCCL 2.18.5, "
    "all_reduce (NVLS), in-place busbw. RAMP_BYTES and NVLS_EFFICIENCY were calibrated on this curve."
)
AZURE_H200 = (
    "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_H200_v5_results.md "
    "'NCCL Bandwidth': Azure ND H200 v5, 8x H200 (same NVLink4/NVSwitch), NCCL 2.20.5, "
    "all_reduce (NVLS), in-place busbw. Not used for calibration."
)
RING_1455 = (
    "https://github.com/NVIDIA/nccl/issues/1455: 8x H100 SXM, NCCL_ALGO=RING, 2-4 GiB: "
    "'busbw is about 365-370 GBps' (NVIDIA also quotes 370 GB/s for Ring, nccl-tests#212)."
)
ROCE_1221 = (
    "https://github.com/NVIDIA/nccl/issues/1221: 8x H100 + 8x 400 Gb/s RoCE per node, NCCL 2.19.3, "
    "all_reduce_perf -b 4G -e 8G: '1 or 2 nodes' ~330 GB/s (NVLS off) / ~430 (NVLS on), used here "
    "for 2 nodes; 4 nodes ~320 either way."
)
DGX_A100_812 = (
    "https://github.com/NVIDIA/nccl/issues/812 (NVIDIA, AddyLaddy): 'On an Nvidia DGX-A100 system "
    "we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW' (Ring across nodes)."
)
# 8 and 16 nodes of 8x H100: no published nccl-tests figure with its hardware stated turned up in
# our search (NVIDIA issues, nccl-tests issues, cloud benchmark guides), so those cases are left
# out; test_ring_bus_bandwidth_holds_with_scale checks the model's shape there instead.
PUBLISHED = [
    *[
        ("h100", 8, 1, size * MiB, busbw, AZURE_H100)
        for size, busbw in [
            (64, 361.78), (128, 400.61), (256, 423.38), (512, 438.46),
            (1024, 466.35), (2048, 472.36), (4096, 475.54), (8192, 478.87),
        ]
    ],
    *[
        ("h200", 8, 1, size * MiB, busbw, AZURE_H200)
        for size, busbw in [
            (64, 368.11), (128, 412.45), (256, 432.24), (512, 442.72),
            (1024, 467.58), (2048, 472.57), (4096, 477.41), (8192, 479.98),
        ]
    ],
    ("h100-no-nvls", 8, 1, 2 * GiB, 367.5, RING_1455),
    ("h100-no-nvls", 8, 1, 4 * GiB, 367.5, RING_1455),
    ("h100", 8, 2, 4 * GiB, 430.0, ROCE_1221),
    ("h100", 8, 2, 8 * GiB, 430.0, ROCE_1221),
    ("h100-no-nvls", 8, 2, 4 * GiB, 330.0, ROCE_1221),
    ("h100-no-nvls", 8, 2, 8 * GiB, 330.0, ROCE_1221),
    ("h100", 8, 4, 4 * GiB, 320.0, ROCE_1221),
    ("h100", 8, 4, 8 * GiB, 320.0, ROCE_1221),
    ("a100", 8, 2, 4 * GiB, 192.0, DGX_A100_812),
]  # fmt: skip
TOPOLOGIES = {
    "h100": H100,
    "h200": Topology.preset("h200"),
    "h100-no-nvls": H100_NO_NVLS,
    "a100": Topology.preset("a100"),
}


@pytest.mark.parametrize(("topology", "p", "m", "size", "busbw", "source"), PUBLISHED)
def test_all_reduce_bus_bandwidth_matches_published_nccl_tests(topology, p, m, size, busbw, source):
    """Predicted all_reduce bus bandwidth lies within 10% of a published nccl-tests figure."""
    time = collective_time_us("all_reduce", size, p, m, TOPOLOGIES[topology])
    predicted = bus_bandwidth_gbps("all_reduce", size, p * m, time)
    assert predicted == pytest.approx(busbw, rel=0.10), source


def test_ring_bus_bandwidth_holds_with_scale():
    """At 8 GiB the all_reduce bus bandwidth on 4, 8 and 16 nodes stays within 5% (busbw's point)."""
    busbw = [
        bus_bandwidth_gbps(
            "all_reduce", 8 * GiB, 8 * m, collective_time_us("all_reduce", 8 * GiB, 8, m, H100)
        )
        for m in (4, 8, 16)
    ]
    assert max(busbw) / min(busbw) < 1.05


def test_all_to_all_across_nodes_runs_at_the_nic_rate():
    """Across nodes all_to_all is bounded by each GPU's NIC, not by NVLink."""
    for p, m in [(8, 2), (8, 8), (1, 8)]:
        n = p * m
        time = collective_time_us("all_to_all", 4 * GiB, p, m, H100)
        nic_bound_us = 4 * GiB * (n - p) / n / (H100.inter_node_gbps * 1000)
        assert nic_bound_us < time < 1.25 * nic_bound_us


def test_bus_bandwidth_uses_nccl_tests_factors():
    """busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n for the others."""
    assert bus_bandwidth_gbps("all_reduce", 1e9, 8, 1e6) == pytest.approx(1.75)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_bandwidth_gbps(op, 1e9, 8, 1e6) == pytest.approx(0.875)


def test_model_and_function_agree():
    """The caching CollectiveModel and the plain function give the same times."""
    model = CollectiveModel(H100)
    for op in OPS:
        for shape in SHAPES:
            for size in (KiB, 3 * MiB, GiB):
                assert model.time_us(op, size, *shape) == collective_time_us(op, size, *shape, H100)


def test_collective_table_rows():
    """The default table covers 4 ops x 9 group sizes (2..512) x 12 sizes (1 KiB..4 GiB)."""
    rows = collective_table(H100)
    assert len(rows) == 4 * 9 * 12
    assert set(rows[0]) == {"op", "ranks", "nodes", "bytes", "time_us", "busbw_GBps"}
    by_key = {(r["op"], r["ranks"], r["bytes"]): r for r in rows}
    assert by_key[("all_reduce", 4, KiB)]["nodes"] == 1
    assert by_key[("all_reduce", 512, 4 * GiB)]["nodes"] == 64
    assert all(r["time_us"] > 0 and r["busbw_GBps"] > 0 for r in rows)
    assert len(collective_table(H100, ranks=[16], sizes=[MiB])) == 4


def test_bad_input_names_the_value():
    """Unknown ops and bad group sizes are errors that name the value and the rule."""
    with pytest.raises(ValueError, match=r"Unknown collective 'allreduce'; allowed: all_gather"):
        collective_time_us("allreduce", MiB, 8, 1, H100)
    with pytest.raises(ValueError, match=r"nodes \(0\) must be an int >= 1"):
        CollectiveModel(H100).time_us("all_reduce", MiB, 8, 0)
    with pytest.raises(ValueError, match=r"nbytes \(-1\) must be a finite number >= 0"):
        collective_time_us("all_reduce", -1, 8, 1, H100)
    with pytest.raises(ValueError, match=r"Group size 12 must be an int"):
        collective_table(H100, ranks=[12])
