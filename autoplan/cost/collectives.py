"""Time of one NCCL collective on one process group, after NCCL's own tuning model.

Stage: ``cost/``; redistribution pricing turns placement changes into calls here.
Inputs: the op, its size in bytes, the group's shape (ranks per node ``p``,
nodes ``m``) and a ``Topology``.
Outputs: microseconds; the winning (algorithm, protocol); a table of times and
bus bandwidths that backs ``autoplan collectives``.
Why: the ILP trades compute for communication, so it needs a time per
collective that is right in shape (latency-bound small messages, bandwidth-bound
large ones, NVLink versus network) and close in value.

Model. NCCL prices every (algorithm, protocol) pair as ``latency + bytes /
algbw`` and runs the cheapest (NVIDIA/nccl ``src/graph/tuning.cc``,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``); we do the same:

* Algorithms: Ring (every op), Tree (all_reduce), NVLS (NVLink SHARP, one-node
  all_reduce) and NVLS-Tree (NVLS inside nodes, a tree across them); all_gather
  and reduce_scatter run on Ring only. Protocols: LL, LL128 and Simple.
* Latency = base latency + hops x per-hop latency. Base and per-hop values are
  tuning.cc's ``baseLat`` and ``hwLat`` (NVLink and NET rows); the topology's
  ``intra_node_latency_us`` / ``inter_node_latency_us`` rescale the NVLink / NET
  rows (their defaults, 3.4 us and 14 us, are NCCL's Ring/Simple hops). A ring
  takes ``nsteps`` hops, 2(m-1) (all_reduce) or m-1 of them across nodes; a
  tree takes 2((p-1) intra + log2(m) inter) hops. Multi-node rings pay at least
  the 1 us per-step network overhead (x3 for Simple). We leave out NCCL's 1.4x
  "plateau" on the latency of Simple ring all_reduce across nodes: with it an
  all_reduce can cost more than the reduce_scatter + all_gather it fuses,
  which the planner must never believe.
* Bus bandwidth: NVLink at 20.6 of 25 GB/s per link (topo.h ``SM90_NVLINK_BW``,
  which NVIDIA quotes as "an effective NVLink bandwidth of 370GB/s" on H100,
  nccl-tests#212); across nodes the ``p`` NICs of a node carry the ring, so the
  link is ``min(NVLink, p x NIC)``. Protocol caps from tuning.cc: LL x0.5
  (capped at NCCL's ``llMaxBws``), LL128 x0.92, Tree x0.92 (LL /3.8, LL128 x7/9
  in a node and x120/128 across) and Tree's medium-size ``treeCorrectionFactor``
  table, interpolated between its power-of-two sizes so that time never falls
  as the size grows. Bus to algorithm bandwidth: Ring n/nsteps, Tree 1/2.
* Additions, each calibrated and labelled as such below. NVLS runs at n/(n+1)
  of an effective wire rate (NVIDIA: "algobw = busbw * n / (n+1)", nccl-tests
  PR #239; peak busbw ~480 GB/s and algbw ~275 GB/s on 8xH100, nccl-tests#212);
  NVLS-Tree runs at 5/6 (tuning.cc's NVLS ratio) of the slower of that and the
  node's NICs. Simple-protocol Ring, NVLS and all_to_all pay a pipeline ramp:
  ``RAMP_BYTES`` more moved at the algorithm bandwidth, scaled by
  S / (S + ramp) so that a small message pays in proportion. Across m nodes
  every algorithm and protocol pays ``NET_RAMP_BYTES`` x m more (one network
  stage to fill per node crossed). NCCL's model has no such term (Tree has its
  correction table instead), yet published nccl-tests curves reach peak only
  in the GiB range (NVIDIA: "256M is too small to reach peak bandwidth",
  nccl-tests#212), and at mid sizes the published multi-node busbw keeps falling
  with the node count while the peak does not (nccl-tests#309, nccl#1469), which
  the per-node ramp reproduces. ``NET_EFFICIENCY`` is fitted to published
  multi-node figures too.
* all_to_all has no entry in tuning.cc. We price it as a pairwise exchange: the
  NVLink and NIC transfers of each rank run concurrently, so the slower one
  (the NIC once nodes > 1) bounds it; its latency is that of an n-1 step ring,
  the round count of pairwise exchange (Thakur, Rabenseifner and Gropp 2005), its NIC
  share ``A2A_NET_EFFICIENCY`` (point-to-point), not the rings' ``NET_EFFICIENCY``.

A calibrated topology (``Topology.collectives``, :mod:`autoplan.core.measured`) replaces
all of the above, for the ops and link classes it measured, by its own ring fit.

Sizes follow nccl-tests (``PERFORMANCE.md``): all_gather / reduce_scatter take
the full gathered buffer, all_reduce the buffer, all_to_all one rank's send
buffer. Bus bandwidth is nccl-tests' ``busbw``: algbw x 2(n-1)/n for
all_reduce and x (n-1)/n for all_gather, reduce_scatter and all_to_all.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from autoplan.core.errors import PlanError
from autoplan.core.measured import MEASURED_CHOICE, measured_time_us
from autoplan.core.topology import Topology

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
_PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc baseLat (us) per protocol (LL, LL128, Simple); NVLS and NVLS-Tree have none.
_BASE_LAT = {"Ring": (6.6, 14.0, 8.4), "Tree": (6.8, 14.0, 8.4)}
# tuning.cc hwLat (us per hop): NVLink rows and NET rows per protocol; NVLS (an NVLink hop)
# and NVLS-Tree (a NET hop) are Simple only, one figure each.
_NVLINK_HOP = {"Ring": (0.6, 1.9, 3.4), "Tree": (0.6, 1.25, 4.0)}
_NVLS_NVLINK_HOP = 25.0
_NET_HOP = {"Ring": (2.7, 4.0, 14.0), "Tree": (5.0, 8.5, 14.0)}
_NVLS_TREE_NET_HOP = 14.0
_REF_NVLINK_HOP_US = 3.4  # the Ring/Simple NVLink hop the topology's latency rescales
_REF_NET_HOP_US = 14.0  # the Ring/Simple NET hop
_NET_OVERHEAD_US = 1.0  # getNetOverhead() on x86 Intel hosts; x3 for Simple

# Bandwidth efficiencies.
NVLINK_EFFICIENCY = 20.6 / 25.0
"""Usable share of raw NVLink: NCCL's 20.6 GB/s per Hopper link (topo.h) of 25 GB/s."""
NET_EFFICIENCY = 0.88
"""Usable share of NIC line rate: one value between the published shares of NVIDIA's NDR and
DGX A100 runs (nccl-tests#290, nccl#812) and of a RoCE H100 cluster (nccl#1221)."""
A2A_NET_EFFICIENCY = 48.5 / 50.0
"""all_to_all's NIC share: 48-49 GB/s point to point on 400 Gb/s (nccl-tests#267, #130)."""
NVLS_EFFICIENCY = 275.0 * 9.0 / 8.0 / 450.0
"""Effective NVLink wire rate under NVLS: algbw 275 GB/s x (n+1)/n at n=8 on 450 GB/s H100."""
_NVLS_TREE_RATIO = 5.0 / 6.0  # tuning.cc's NVLS bus-to-algorithm ratio, for the network stage
RAMP_BYTES = 20 * 2**20
"""Simple-protocol pipeline ramp, bytes. Fitted to the 8xH100 NVLS curve (Azure ND H100 v5)
together with the multi-node curves of nccl-tests#309."""
NET_RAMP_BYTES = 4 * 2**20
"""Extra ramp per node crossed, bytes, for every protocol. Fitted to the 2/4/8-node 8xH100
curves of nccl-tests#309 (64 MiB-8 GiB); it equals NCCL's default NCCL_BUFFSIZE (4 MiB), the
staging buffer each network connection fills before its pipeline runs at full rate."""

_LL128_FACTOR = 0.92
_RING_LL_FACTOR = 0.5
_TREE_FACTOR = 0.92
_TREE_LL_FACTOR = 1.0 / 3.8
# llMaxBws: one node is GPU-bound (Ampere 87.7, Hopper 141, Blackwell 282 GB/s, ~0.38 of each
# generation's usable NVLink); across nodes the x86 host row applies (2 nodes 39.0, more 20.4).
_LL_MAX_NVLINK_SHARE = 0.38
_LL_MAX_TWO_NODES = 39.0
_LL_MAX_MORE_NODES = 20.4

# tuning.cc treeCorrectionFactor, rows LL/LL128/Simple, index log2(bytes >> 6), 64 B..256 MiB;
# NCCL applies none (1.0) from 512 MiB on, which we append as a last entry.
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, 1.0),
)  # fmt: skip


def _tree_correction(row: tuple[float, ...], nbytes: float) -> float:
    """The table's factor, linear in log2(size) between entries (NCCL steps instead)."""
    x = math.log2(max(nbytes, 64.0) / 64.0)
    index = int(x)
    if index >= len(row) - 1:
        return row[-1]
    return row[index] + (row[index + 1] - row[index]) * (x - index)


_BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


@dataclass(frozen=True, slots=True)
class _Candidate:
    """One (algorithm, protocol) pair priced for one group shape."""

    algorithm: str
    protocol: str
    latency_us: float
    us_per_byte: float  # 1 / algbw
    ramp_us: float  # the ramp of a message much larger than ramp_bytes
    ramp_bytes: float  # pipeline ramp, bytes; 0 for none
    tree_row: int  # row of _TREE_CORRECTION, or -1

    def time_us(self, nbytes: float) -> float:
        per_byte = self.us_per_byte
        if self.tree_row >= 0:
            per_byte /= _tree_correction(_TREE_CORRECTION[self.tree_row], nbytes)
        # The ramp grows with the message and saturates: a message much smaller than
        # ramp_bytes never fills the pipeline and moves at about half the rate.
        ramp = self.ramp_us * nbytes / (nbytes + self.ramp_bytes) if self.ramp_bytes else 0.0
        return self.latency_us + ramp + nbytes * per_byte


def _candidate(
    algorithm: str, protocol: str, latency: float, algbw: float, nodes: int = 1
) -> _Candidate:
    us_per_byte = 1.0 / (1000.0 * algbw)  # GB/s -> bytes per us is x1000
    # In one node only Simple pays the ramp (Tree has NCCL's correction table instead).
    ramp_bytes = RAMP_BYTES if protocol == "Simple" and algorithm != "Tree" else 0.0
    if nodes > 1:
        # Across nodes every algorithm and protocol also fills one network stage per node.
        ramp_bytes = (RAMP_BYTES if protocol == "Simple" else 0.0) + NET_RAMP_BYTES * nodes
    tree_row = _PROTOCOLS.index(protocol) if algorithm == "Tree" else -1
    return _Candidate(
        algorithm, protocol, latency, us_per_byte, ramp_bytes * us_per_byte, ramp_bytes, tree_row
    )


def _ring_latency(i: int, nsteps: int, inter_steps: int, p: int, m: int, topo: Topology) -> float:
    """tuning.cc ring latency: base + intra hops + inter hops (protocol index ``i``)."""
    hop_intra = _NVLINK_HOP["Ring"][i] * topo.intra_node_latency_us / _REF_NVLINK_HOP_US
    if m > 1:
        hop_intra = max(hop_intra, _NET_OVERHEAD_US * (3 if _PROTOCOLS[i] == "Simple" else 1))
    # With one rank per node NCCL charges the Tree row: nothing hides the network hop.
    hop_inter = (
        _NET_HOP["Tree" if p == 1 else "Ring"][i] * topo.inter_node_latency_us / _REF_NET_HOP_US
    )
    return _BASE_LAT["Ring"][i] + (nsteps - inter_steps) * hop_intra + inter_steps * hop_inter


def _candidates(op: str, p: int, m: int, topo: Topology) -> tuple[_Candidate, ...]:
    """Every eligible (algorithm, protocol) pair for ``op`` on a p x m group."""
    n = p * m
    nvlink = topo.intra_node_gbps * NVLINK_EFFICIENCY
    nic = topo.inter_node_gbps * NET_EFFICIENCY
    link = nvlink if m == 1 else min(nvlink, p * nic)
    nvl_scale = topo.intra_node_latency_us / _REF_NVLINK_HOP_US
    net_scale = topo.inter_node_latency_us / _REF_NET_HOP_US
    log2_m = m.bit_length() - 1  # NCCL's log2i: floor
    if m == 1:
        ll_max = _LL_MAX_NVLINK_SHARE * nvlink
    else:
        ll_max = _LL_MAX_TWO_NODES if m == 2 else _LL_MAX_MORE_NODES

    if op == "all_to_all":
        # Per rank: (p-1)/n of the buffer over NVLink, (n-p)/n over its NIC, concurrently.
        nic_bw = n * topo.inter_node_gbps * A2A_NET_EFFICIENCY / (n - p) if m > 1 else math.inf
        algbw = min(n * nvlink / (p - 1) if p > 1 else math.inf, nic_bw)
        latency = _ring_latency(2, n - 1, m - 1, p, m, topo)
        return (_candidate("Pairwise", "Simple", latency, algbw, m),)

    all_reduce = op == "all_reduce"
    nsteps = 2 * (n - 1) if all_reduce else n - 1
    inter_steps = 0 if m == 1 else 2 * (m - 1) if all_reduce else m - 1
    ring_bus = (min(link * _RING_LL_FACTOR, ll_max), link * _LL128_FACTOR, link)
    out = []
    for i, protocol in enumerate(_PROTOCOLS):
        latency = _ring_latency(i, nsteps, inter_steps, p, m, topo)
        out.append(_candidate("Ring", protocol, latency, ring_bus[i] * n / nsteps, m))
    if not all_reduce:
        return tuple(out)

    tree = link * _TREE_FACTOR
    tree_bus = (min(tree * _TREE_LL_FACTOR, ll_max), tree * (7 / 9 if m == 1 else 120 / 128), tree)
    for i, protocol in enumerate(_PROTOCOLS):
        intra_hops = (p - 1) * _NVLINK_HOP["Tree"][i] * nvl_scale
        inter_hops = log2_m * _NET_HOP["Tree"][i] * net_scale
        latency = _BASE_LAT["Tree"][i] + 2 * (intra_hops + inter_hops)  # up, then down
        out.append(_candidate("Tree", protocol, latency, tree_bus[i] * 0.5, m))

    if topo.nvls and p > 1:
        nvls = topo.intra_node_gbps * NVLS_EFFICIENCY * p / (p + 1)
        if m == 1:
            out.append(_candidate("NVLS", "Simple", _NVLS_NVLINK_HOP * nvl_scale, nvls))
        else:
            # Heads exchange the node-reduced buffer over p NICs; inner tree nodes serve two
            # children as well as a parent, hence half the network rate beyond two nodes.
            network = p * nic if m <= 2 else p * nic / 2
            latency = _NVLS_NVLINK_HOP * nvl_scale + 2 * log2_m * _NVLS_TREE_NET_HOP * net_scale
            out.append(
                _candidate("NVLSTree", "Simple", latency, min(nvls, network) * _NVLS_TREE_RATIO, m)
            )
    return tuple(out)


def _is_size(nbytes: object) -> bool:
    if not isinstance(nbytes, numbers.Real) or isinstance(nbytes, bool):
        return False
    return 0 <= float(nbytes) < math.inf


def _check(op: str, nbytes: float, p: int, m: int, dtype_bytes: int) -> None:
    if op not in OPS:
        raise PlanError(f"Unknown collective {op!r}; allowed: {', '.join(OPS)}.")
    for what, value in (("ranks_per_node", p), ("nodes", m), ("dtype_bytes", dtype_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise PlanError(f"{what} ({value!r}) must be an int >= 1.")
    if not _is_size(nbytes):
        raise PlanError(f"nbytes ({nbytes!r}) must be a finite number >= 0.")


def _padded(nbytes: float, n: int, dtype_bytes: int) -> float:
    """Bytes after splitting into n chunks of whole elements, as NCCL's counts are."""
    return math.ceil(nbytes / (n * dtype_bytes)) * n * dtype_bytes


def _best(candidates: tuple[_Candidate, ...], nbytes: float) -> tuple[float, _Candidate]:
    best = min(candidates, key=lambda c: c.time_us(nbytes))
    return best.time_us(nbytes), best


class CollectiveModel:
    """Collective times on one topology; remembers the candidates of each group shape.

    Build one per planning run and call ``time_us`` as often as needed; the cache
    lives and dies with the object.
    """

    __slots__ = ("topology", "_cache")

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._cache: dict[tuple[str, int, int, int], tuple[_Candidate, ...]] = {}

    def _lookup(
        self, op: str, nbytes: float, p: int, m: int, dtype_bytes: int
    ) -> tuple[float, tuple[str, str]] | None:
        key = (op, p, m, dtype_bytes)
        candidates = self._cache.get(key)
        if candidates is None:
            _check(op, nbytes, p, m, dtype_bytes)
            shape = int(p), int(m)
            candidates = () if shape == (1, 1) else _candidates(op, *shape, self.topology)
            self._cache[key] = candidates
        elif not _is_size(nbytes):
            _check(op, nbytes, p, m, dtype_bytes)
        if not candidates or nbytes == 0:
            return None
        padded = _padded(nbytes, int(p) * int(m), dtype_bytes)
        fits = self.topology.collectives
        # a calibrated job's ranks arrive apart: every collective of 2+ ranks waits once
        wait = fits.sync_us if fits is not None else 0.0
        measured = measured_time_us(fits, op, padded, int(p), int(m))
        if measured is not None:
            return measured + wait, MEASURED_CHOICE
        time, best = _best(candidates, padded)
        return time + wait, (best.algorithm, best.protocol)

    def time_us(
        self, op: str, nbytes: float, ranks_per_node: int, nodes: int, *, dtype_bytes: int = 2
    ) -> float:
        """Microseconds for ``op`` on ``nbytes`` over a group of ``ranks_per_node`` x ``nodes``."""
        found = self._lookup(op, nbytes, ranks_per_node, nodes, dtype_bytes)
        return 0.0 if found is None else found[0]

    def choice(
        self, op: str, nbytes: float, ranks_per_node: int, nodes: int, *, dtype_bytes: int = 2
    ) -> tuple[str, str]:
        """The winning (algorithm, protocol); ``("None", "None")`` for a group of one."""
        found = self._lookup(op, nbytes, ranks_per_node, nodes, dtype_bytes)
        return ("None", "None") if found is None else found[1]


def collective_time_us(
    op: str,
    nbytes: float,
    ranks_per_node: int,
    nodes: int,
    topology: Topology,
    *,
    dtype_bytes: int = 2,
) -> float:
    """Microseconds for one collective; a group of one rank (or zero bytes) costs 0.

    For many calls on one topology, hold a ``CollectiveModel`` instead: it caches.
    """
    return CollectiveModel(topology).time_us(
        op, nbytes, ranks_per_node, nodes, dtype_bytes=dtype_bytes
    )


def algorithm_choice(
    op: str, nbytes: float, ranks_per_node: int, nodes: int, topology: Topology
) -> tuple[str, str]:
    """The (algorithm, protocol) our model picks, e.g. ``("Ring", "LL")``."""
    return CollectiveModel(topology).choice(op, nbytes, ranks_per_node, nodes)


def bus_bandwidth_gbps(op: str, nbytes: float, ranks: int, time_us: float) -> float:
    """nccl-tests' bus bandwidth (GB/s) of an op that moved ``nbytes`` in ``time_us``."""
    if op not in OPS:
        raise PlanError(f"Unknown collective {op!r}; allowed: {', '.join(OPS)}.")
    if isinstance(ranks, bool) or not isinstance(ranks, numbers.Integral) or ranks < 1:
        raise PlanError(f"ranks ({ranks!r}) must be an int >= 1.")
    if ranks == 1:
        return 0.0
    if not time_us > 0:
        raise PlanError(f"time_us ({time_us!r}) must be > 0 for a group of {ranks} ranks.")
    return nbytes / (time_us * 1000.0) * _BUSBW_FACTOR[op](ranks)


def collective_table(
    topology: Topology, *, ranks: list[int] | None = None, sizes: list[int] | None = None
) -> list[dict]:
    """Times and bus bandwidths for every op, group size and message size.

    A group of N ranks fills nodes first: min(N, gpus_per_node) per node. The
    defaults are 2..512 ranks (powers of 2) and 1 KiB..4 GiB (powers of 4).
    """
    ranks = [2**k for k in range(1, 10)] if ranks is None else ranks
    sizes = [1024 * 4**k for k in range(12)] if sizes is None else sizes
    model = CollectiveModel(topology)
    rows = []
    for op in OPS:
        for n in ranks:
            p = min(n, topology.gpus_per_node) if isinstance(n, int) else 0
            if isinstance(n, bool) or p < 1 or n % p:
                raise PlanError(
                    f"Group size {n!r} must be an int >= 1 that fills whole nodes of "
                    f"{topology.gpus_per_node} GPUs (or fits in one)."
                )
            for size in sizes:
                t = model.time_us(op, size, p, n // p)
                busbw = bus_bandwidth_gbps(op, size, n, t) if t > 0 else 0.0
                rows.append(
                    {
                        "op": op,
                        "ranks": n,
                        "nodes": n // p,
                        "bytes": size,
                        "time_us": t,
                        "busbw_GBps": busbw,
                    }
                )
    return rows
