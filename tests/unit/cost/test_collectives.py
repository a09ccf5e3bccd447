"""Tests for autoplan.cost.collectives: NCCL-style collective times and bus bandwidths."""

import dataclasses

import pytest

from autoplan.core.topology import Topology
from autoplan.cost.collectives import (
    OPS,
    CollectiveModel,
    algorithm_choice,
    bus_bandwidth_gbps,
    collective_table,
    collective_time_us,
)

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
# Honesty note: RAMP_BYTES was fitted to the Azure H100 curve and the nccl-tests#309 multi-node
# curves, NET_RAMP_BYTES to the #309 curves, NVLS_EFFICIENCY to NVIDIA's "~480 busbw / ~275 algbw"
# (nccl-tests#212) and NET_EFFICIENCY to the #1221 and #812 figures, so those rows guard the
# calibration. The H200 curve and the Ring row (#1455, predicted from NCCL's
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
SIZES_64M_8G = [2**k * MiB for k in range(6, 14)]  # 64 MiB .. 8 GiB, nccl-tests' -f 2 steps


def _curve(topology, m, busbws, source):
    """Rows for one published nccl-tests sweep of 8-GPU nodes, 64 MiB to 8 GiB."""
    return [(topology, 8, m, s, b, source) for s, b in zip(SIZES_64M_8G, busbws, strict=True)]


# Multi-node 8x H100 with 8x 400 Gb/s InfiniBand NDR per node, default NCCL settings,
# all_reduce_perf out-of-place busbw. All in one thread, https://github.com/NVIDIA/nccl-tests/issues/309
# ("Acceptable performance of nccl-test on 2 or 4 HGX hosts?"); NVIDIA (kiskra-nvidia) answers
# there that 4 nodes at ~365 GB/s is "a good number" and 8 nodes at ~320 GB/s is "possible".
# None of these runs set a constant except NET_RAMP_BYTES and RAMP_BYTES, fitted to them jointly.
IB_309_2N = (
    "nccl-tests#309, opening post (qoofyk): Dell XE9680, 8x H100 + 8x CX-7 IB 400 Gbps, NCCL "
    "2.26.2, 2 nodes, `all_reduce_perf_mpi -b 8 -e 16g -f 2 -g 1` (NVLS-Tree)."
)
IB_309_4N = (
    "nccl-tests#309, qoofyk 2025-05-23: the same H100/CX-7 400G hosts, 4 nodes (32 GPU-NIC "
    "pairs, VMs with an NCCL topology file), NCCL 2.26.2, max busbw 365.84 GB/s."
)
IB_309_8N = (
    "nccl-tests#309, gj-aion 2025-06-18: 'our 8 node cluster achieves ~320 GB/s busbw on "
    "AllReduce' (8x H100 per node; 'IB 400G', with 400 GB/s 'the IB limit of our network', "
    "i.e. 8x 400 Gb/s), `-b 1M -e 8G -f 2 -g 1`."
)
IB_309_2OF8 = (
    "nccl-tests#309, gj-aion 2025-06-18: the same cluster, '2 out of 8 nodes' (465+ GB/s)."
)
IB_309_4OF8 = (
    "nccl-tests#309, gj-aion 2025-06-18: the same cluster, '4 out of 8 nodes' (~325 GB/s)."
)
IB_1469_16N = (
    "https://github.com/NVIDIA/nccl/issues/1469 (szhengac): 'On 16 H100 nodes ... the busbw "
    "for 67108864B ... sometimes can reach a normal value like 150GB/s', NCCL 2.20.5."
)
# 16 nodes of 8x H100 on InfiniBand: only the single 64 MiB figure above turned up; the 16-node
# curve below (P5_EFA) is on AWS EFA. No multi-node all_gather / reduce_scatter sweep with its
# hardware stated turned up for 2-16 nodes (nccl#1218 reports all_gather at 32 nodes only).
MULTI_NODE = [
    *_curve("h100", 2, [269.98, 336.29, 392.35, 426.97, 448.90, 461.24, 466.52, 468.46], IB_309_2N),
    *_curve("h100", 4, [224.53, 262.48, 294.16, 334.58, 358.14, 361.56, 363.54, 364.93], IB_309_4N),
    *_curve("h100", 8, [184.00, 227.97, 270.31, 300.51, 286.81, 319.03, 319.83, 320.70], IB_309_8N),
    *_curve("h100", 2, [263.66, 335.25, 388.31, 423.57, 447.65, 459.29, 465.77, 466.73], IB_309_2OF8),
    # 4 of 8 at 256 MiB (234.35) is left out here: see test_published_4_node_figures_conflict.
    *[
        row
        for row in _curve(
            "h100", 4, [208.34, 246.41, 234.35, 288.88, 322.02, 322.71, 324.99, 324.52], IB_309_4OF8
        )
        if row[3] != 256 * MiB
    ],
    ("h100", 8, 16, 64 * MiB, 150.0, IB_1469_16N),
]  # fmt: skip
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


@pytest.mark.parametrize(("topology", "p", "m", "size", "busbw", "source"), PUBLISHED + MULTI_NODE)
def test_all_reduce_bus_bandwidth_matches_published_nccl_tests(topology, p, m, size, busbw, source):
    """Predicted all_reduce bus bandwidth lies within 10% of a published nccl-tests figure."""
    time = collective_time_us("all_reduce", size, p, m, TOPOLOGIES[topology])
    predicted = bus_bandwidth_gbps("all_reduce", size, p * m, time)
    assert predicted == pytest.approx(busbw, rel=0.10), source


def _predicted_busbw(topology, p, m, size):
    time = collective_time_us("all_reduce", size, p, m, TOPOLOGIES[topology])
    return bus_bandwidth_gbps("all_reduce", size, p * m, time)


def test_published_4_node_figures_conflict():
    """At 256 MiB two published 4-node InfiniBand runs differ by 25%: no prediction fits both.

    nccl-tests#309 reports 294.16 GB/s (qoofyk's 4 nodes) and 234.35 GB/s (gj-aion's 4 of 8
    nodes, a dip below its own 246.41 at 128 MiB). The model must lie between the two; the
    within-10% test keeps the first and leaves the second out.
    """
    low, high = 234.35, 294.16
    assert high / low > 1.1 / 0.9  # no single value is within 10% of both
    assert low < _predicted_busbw("h100", 8, 4, 256 * MiB) < high


# AWS p5.48xlarge (8x H100, 32 EFA interfaces = 3200 Gb/s, i.e. 400 Gb/s per GPU), NCCL over the
# aws-ofi-nccl plugin and its tuner, NCCL_BUFFSIZE=8 MiB, all_reduce_perf -b 32M -e 8192M -f 2
# -g 1 -c 1 -n 1000 on 2-32 nodes, in-place busbw:
P5_EFA = (
    "https://github.com/crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv "
    "(runs: k8s/nccl_all_reduce_perf.yaml; README: SageMaker HyperPod p5.48xlarge, EFA)."
)
P5_EFA_CURVES = {
    2: [225.95, 300.29, 365.84, 396.78, 436.04, 444.64, 465.55, 477.68],
    4: [152.63, 229.85, 274.12, 278.68, 280.27, 347.56, 354.24, 357.08],
    8: [102.49, 154.33, 234.18, 271.56, 273.66, 279.59, 351.73, 353.65],
    16: [96.10, 128.73, 148.34, 230.42, 267.99, 274.40, 311.65, 353.92],
}
# The model prices InfiniBand (tuning.cc's NET latencies); EFA's curves differ from it below 4 GiB.
# At 4-16 nodes they sit on a ~275 GB/s shelf from 512 MiB to 2 GiB and then jump to ~350 at
# 4 GiB (the tuner's algorithm switch, not a bandwidth change), and they fall away at 64-256 MiB
# (16 nodes, 64 MiB: 96 GB/s on EFA where InfiniBand reaches ~150, nccl#1469): up to +79% there.
# On 2 nodes EFA peaks at 478 GB/s, 10.4% above the model's 428 (InfiniBand #309: 468, RoCE
# #1221: 430). So we hold the model to EFA where EFA is bandwidth-bound: 4-16 nodes, >= 4 GiB.


@pytest.mark.parametrize("m", [4, 8, 16])
@pytest.mark.parametrize("size", [4 * GiB, 8 * GiB])
def test_p5_efa_bandwidth_bound_sizes_match(m, size):
    """On AWS p5 (EFA) at 4-16 nodes and >= 4 GiB the prediction is within 10%."""
    published = P5_EFA_CURVES[m][SIZES_64M_8G.index(size)]
    assert _predicted_busbw("h100", 8, m, size) == pytest.approx(published, rel=0.10), P5_EFA


def test_64_mib_bus_bandwidth_falls_with_the_node_count():
    """At 64 MiB published busbw falls with every doubling of nodes; the model's does too."""
    # 2, 4, 8, 16 nodes: 270, 225, 184 GB/s (nccl-tests#309) and ~150 (nccl#1469), while the
    # 8 GiB figures stay at 320-470. Without a per-node ramp the model stays flat past 4 nodes.
    busbw = [_predicted_busbw("h100", 8, m, 64 * MiB) for m in (2, 4, 8, 16)]
    assert all(a > b for a, b in zip(busbw, busbw[1:], strict=False)), busbw


def test_collective_table_multi_node_rows_match_published():
    """The table behind `autoplan collectives` agrees with nccl-tests#309 on 2, 4 and 8 nodes."""
    rows = collective_table(H100, ranks=[16, 32, 64], sizes=[64 * MiB, GiB, 4 * GiB])
    got = {(r["nodes"], r["bytes"]): r["busbw_GBps"] for r in rows if r["op"] == "all_reduce"}
    published = {(row[2], row[3]): row[4] for row in MULTI_NODE[:24]}  # the first three curves
    for key, busbw in got.items():
        assert busbw == pytest.approx(published[key], rel=0.10), key


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


def test_all_to_all_across_nodes_reports_its_network_share_of_one_nic():
    """An 8 GiB all_to_all over m nodes of 8 H100s: the (n-p)/n of each rank's buffer that
    leaves its node bounds it, at one 400 Gb/s NIC's 48.5 GB/s, so its bus bandwidth is
    48.5 x (n-1)/(n-p) GB/s, about m/(m-1) NICs (NCCL's maintainers, nccl-tests#130 and
    #267), within 3 %."""
    size = 8 * GiB
    for m in (2, 4, 8, 16):
        n = 8 * m
        time = collective_time_us("all_to_all", size, 8, m, H100)
        busbw = bus_bandwidth_gbps("all_to_all", size, n, time)
        assert busbw == pytest.approx(48.5 * (n - 1) / (n - 8), rel=0.03), m


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
