"""Hardware description: the GPU and the links between GPUs that plans are priced on.

Stage: input to ``cost/`` (compute pricing reads the ``Device``, collective pricing
reads the links of the ``Topology``).
Inputs: a preset name (``"h100"``, ``"h200"``, ``"a100"``, ``"b200"``) or a dict
loaded from YAML (``configs/topology/*.yaml``).
Outputs: frozen ``Device`` and ``Topology`` values; ``group_span`` maps a mesh
axis group onto (ranks per node, nodes).
Why: the same sharding plan costs very different time on NVLink and on the
network, so every cost needs to know how a process group lies across nodes.
Sources: NVIDIA datasheets for H100/H200 (SXM), A100 80GB SXM and HGX B200;
NVLink bandwidth is per GPU per direction, i.e. half the datasheet's
bidirectional figure; NIC bandwidth is the line rate of one NIC per GPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from autoplan.core.errors import PlanError
from autoplan.core.measured import Calibration, CollectiveFits


def _check_number(what: str, value: Any, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{what} ({value!r}) must be a finite number.")
    if positive and value <= 0:
        raise PlanError(f"{what} ({value}) must be > 0.")
    if value < 0:
        raise PlanError(f"{what} ({value}) must be >= 0.")


@dataclass(frozen=True)
class Device:
    """One GPU's peak throughput and memory, as its datasheet states them."""

    name: str
    """Human-readable model name, e.g. ``"H100-SXM5-80GB"``."""
    peak_bf16_tflops: float
    """Dense (no 2:4 sparsity) BF16 tensor-core peak, TFLOP/s."""
    peak_fp32_tflops: float
    """FP32 peak on CUDA cores (not TF32), TFLOP/s."""
    hbm_gbps: float
    """HBM bandwidth, GB/s (10^9 bytes per second)."""
    memory_gib: float
    """HBM capacity, GiB; we take the datasheet's "GB" figure (NVIDIA sizes HBM in binary units)."""
    flops_efficiency: float = 0.7
    """Share of the peak a large matmul reaches: cuBLAS's large bf16 GEMMs reach 70-80 % of
    H100's dense peak. A calibrated device measures its peak and keeps 1."""
    memory_efficiency: float = 0.8
    """Share of ``hbm_gbps`` a streaming kernel reaches (80-90 % on HBM)."""
    op_overhead_us: float = 2.0
    """Fixed cost of every kernel: a launch and the tail a tiny kernel cannot hide on a GPU,
    the dispatch of an eager op on a CPU."""
    attention_efficiency: float = 1.0
    """Share of the matmul peak a fused attention kernel (SDPA's) reaches, beside
    ``flops_efficiency``. The presets keep 1; a calibrated device measures it."""
    view_overhead_us: float = 0.0
    """Host time of a view op, which runs no kernel: 0 where the host dispatches ahead of
    the device (a GPU); on a CPU the host is the device and every view is a dispatcher call."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"Device.name ({self.name!r}) must be a non-empty string.")
        for field in ("peak_bf16_tflops", "peak_fp32_tflops", "hbm_gbps", "memory_gib"):
            _check_number(f"Device.{field}", getattr(self, field), positive=True)
        for field in ("flops_efficiency", "memory_efficiency"):
            _check_number(f"Device.{field}", getattr(self, field), positive=True)
            if getattr(self, field) > 1:
                raise PlanError(f"Device.{field} ({getattr(self, field)}) must be at most 1.")
        _check_number("Device.op_overhead_us", self.op_overhead_us)
        _check_number("Device.attention_efficiency", self.attention_efficiency, positive=True)
        _check_number("Device.view_overhead_us", self.view_overhead_us)

    @staticmethod
    def preset(name: str) -> Device:
        """The datasheet figures of a known GPU: one of ``h100``, ``h200``, ``a100``, ``b200``."""
        key = name.lower() if isinstance(name, str) else name
        if key not in _DEVICES:
            raise PlanError(
                f"Unknown device preset {name!r}; allowed: {', '.join(sorted(_DEVICES))}."
            )
        return _DEVICES[key]


_DEVICES: Mapping[str, Device] = MappingProxyType(
    {
        # H100 SXM5 datasheet: BF16 1,979 TFLOPS with sparsity (989 dense), FP32 67 TFLOPS,
        # HBM3 3.35 TB/s, 80GB.
        "h100": Device("H100-SXM5-80GB", 989.0, 67.0, 3350.0, 80.0),
        # H200 SXM datasheet: same GH100 compute as H100; HBM3e 4.8 TB/s, 141GB.
        "h200": Device("H200-SXM-141GB", 989.0, 67.0, 4800.0, 141.0),
        # A100 80GB SXM datasheet: BF16 624 TFLOPS with sparsity (312 dense), FP32 19.5 TFLOPS,
        # HBM2e 2,039 GB/s, 80GB.
        "a100": Device("A100-SXM4-80GB", 312.0, 19.5, 2039.0, 80.0),
        # HGX B200 datasheet, per GPU: FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense),
        # FP32 75 TFLOPS, HBM3e 180GB at 7.7 TB/s.
        "b200": Device("B200-HGX-180GB", 2250.0, 75.0, 7700.0, 180.0),
    }
)


@dataclass(frozen=True)
class Topology:
    """A cluster of identical nodes: GPUs joined by NVLink inside a node, by NICs across."""

    device: Device = _DEVICES["h100"]
    """The GPU in every slot."""
    gpus_per_node: int = 8
    """GPUs sharing one NVLink/NVSwitch domain."""
    intra_node_gbps: float = 450.0
    """NVLink bandwidth per GPU per direction, GB/s (H100 NVLink4: 900 GB/s bidirectional)."""
    intra_node_latency_us: float = 3.4
    """One NVLink hop for NCCL's Simple protocol, us (tuning.cc hwLat); NCCL's other NVLink
    hop latencies (LL, LL128, Tree, NVLS) are scaled with it."""
    inter_node_gbps: float = 50.0
    """Network bandwidth per GPU, GB/s: one NIC per GPU (400 Gb/s InfiniBand NDR = 50 GB/s)."""
    inter_node_latency_us: float = 14.0
    """One network hop for NCCL's Simple protocol, us (tuning.cc hwLat); NCCL's other
    network hop latencies are scaled with it."""
    nvls: bool = True
    """NVLink SHARP (NVLS): the NVSwitches reduce in-network (Hopper and later)."""
    collectives: CollectiveFits | None = None
    """Measured collectives (``autoplan calibrate``); they replace the NCCL-style model for
    the ops and link classes they cover."""
    calibration: Calibration | None = None
    """Where a calibrated topology's figures come from (None: a datasheet preset)."""

    def __post_init__(self) -> None:
        if not isinstance(self.device, Device):
            raise PlanError(f"Topology.device ({self.device!r}) must be a Device.")
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int):
            raise PlanError(f"Topology.gpus_per_node ({self.gpus_per_node!r}) must be an int.")
        if self.gpus_per_node < 1:
            raise PlanError(f"Topology.gpus_per_node ({self.gpus_per_node}) must be >= 1.")
        _check_number("Topology.intra_node_gbps", self.intra_node_gbps, positive=True)
        _check_number("Topology.inter_node_gbps", self.inter_node_gbps, positive=True)
        _check_number("Topology.intra_node_latency_us", self.intra_node_latency_us)
        _check_number("Topology.inter_node_latency_us", self.inter_node_latency_us)
        if not isinstance(self.nvls, bool):
            raise PlanError(f"Topology.nvls ({self.nvls!r}) must be true or false.")
        if self.collectives is not None and not isinstance(self.collectives, CollectiveFits):
            raise PlanError(f"Topology.collectives ({self.collectives!r}) must be CollectiveFits.")
        if self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise PlanError(f"Topology.calibration ({self.calibration!r}) must be a Calibration.")

    @staticmethod
    def preset(name: str) -> Topology:
        """A standard 8-GPU node cluster: ``h100``, ``h200``, ``a100`` or ``b200``."""
        key = name.lower() if isinstance(name, str) else name
        if key not in _TOPOLOGIES:
            raise PlanError(
                f"Unknown topology preset {name!r}; allowed: {', '.join(sorted(_TOPOLOGIES))}."
            )
        return _TOPOLOGIES[key]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "<dict>") -> Topology:
        """Build from a YAML mapping; unknown keys and wrong types name the key and ``source``.

        ``device`` is a preset name (then the other fields default to that preset's
        topology, so ``{device: a100}`` is a whole A100 cluster) or a mapping of
        ``Device`` fields.
        """
        if not isinstance(d, Mapping):
            raise PlanError(f"{source}: a topology must be a mapping, got {type(d).__name__}.")
        values = dict(d)
        base = cls()
        if "device" in values:
            spec = values.pop("device")
            device = _device_from(spec, source)  # raises, naming the file, if unknown
            base = cls.preset(spec) if isinstance(spec, str) else cls(device=device)
        kwargs: dict[str, Any] = {}
        if "calibration" in values:  # first: a foreign format is refused before its figures
            kwargs["calibration"] = Calibration.from_dict(
                values.pop("calibration"), f"{source}: calibration"
            )
        if "collectives" in values:
            kwargs["collectives"] = CollectiveFits.from_dict(
                values.pop("collectives"), f"{source}: collectives"
            )
        for key, value in values.items():
            if key not in _TOPOLOGY_TYPES:
                allowed = ["device", "collectives", "calibration", *_TOPOLOGY_TYPES]
                raise PlanError(
                    f"{source}: unknown topology key {key!r} (value {value!r}); "
                    f"allowed: {', '.join(sorted(allowed))}."
                )
            kwargs[key] = _typed(f"topology key {key!r}", value, _TOPOLOGY_TYPES[key], source)
        try:
            return dataclasses.replace(base, **kwargs)
        except ValueError as e:
            raise PlanError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping :meth:`from_dict` reads back as this topology."""
        out: dict[str, Any] = {"device": dataclasses.asdict(self.device)}
        out |= {key: getattr(self, key) for key in _TOPOLOGY_TYPES}
        if self.collectives is not None:
            out["collectives"] = self.collectives.to_dict()
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        return out


_TOPOLOGIES: Mapping[str, Topology] = MappingProxyType(
    {
        # DGX/HGX H100: 18 NVLink4 links (900 GB/s bidirectional), 8x ConnectX-7 400 Gb/s.
        "h100": Topology(),
        # HGX H200: same NVLink4 fabric and NICs as H100.
        "h200": Topology(device=_DEVICES["h200"]),
        # DGX A100: 12 NVLink3 links (600 GB/s bidirectional), 8x ConnectX-6 200 Gb/s HDR;
        # no NVLink SHARP before Hopper.
        "a100": Topology(
            device=_DEVICES["a100"], intra_node_gbps=300.0, inter_node_gbps=25.0, nvls=False
        ),
        # DGX B200: 18 NVLink5 links (1.8 TB/s bidirectional), 8x ConnectX-7 400 Gb/s.
        "b200": Topology(device=_DEVICES["b200"], intra_node_gbps=900.0),
    }
)

# Annotations are postponed (``from __future__ import annotations``): each f.type is its string.
_DEVICE_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Device)}
_DEVICE_REQUIRED = [f.name for f in dataclasses.fields(Device) if f.default is dataclasses.MISSING]
_TOPOLOGY_TYPES = {
    f.name: str(f.type)
    for f in dataclasses.fields(Topology)
    if f.name not in ("device", "collectives", "calibration")
}


def _device_from(value: Any, source: str) -> Device:
    if isinstance(value, Device):
        return value
    if isinstance(value, str):
        try:
            return Device.preset(value)
        except ValueError as e:
            raise PlanError(f"{source}: topology key 'device': {e}") from None
    if not isinstance(value, Mapping):
        raise PlanError(
            f"{source}: topology key 'device' has value {value!r}; "
            "expected a preset name or a mapping of device fields."
        )
    kwargs = {}
    for key, item in value.items():
        if key not in _DEVICE_TYPES:
            raise PlanError(
                f"{source}: unknown device key {key!r} (value {item!r}); "
                f"allowed: {', '.join(_DEVICE_TYPES)}."
            )
        kwargs[key] = _typed(f"device key {key!r}", item, _DEVICE_TYPES[key], source)
    missing = [k for k in _DEVICE_REQUIRED if k not in kwargs]
    if missing:
        raise PlanError(f"{source}: device is missing {', '.join(missing)}.")
    try:
        return Device(**kwargs)
    except ValueError as e:
        raise PlanError(f"{source}: {e}") from None


def _typed(what: str, value: Any, type_name: str, source: str) -> Any:
    """Check a YAML scalar against a dataclass field type (annotations are strings here)."""
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }[type_name]
    if not ok:
        raise PlanError(
            f"{source}: {what} has value {value!r} of type {type(value).__name__}; "
            f"expected {type_name}."
        )
    return float(value) if type_name == "float" else value


def group_span(
    mesh_shape: tuple[int, ...], axes: tuple[int, ...], gpus_per_node: int
) -> tuple[int, int]:
    """(ranks per node, nodes) of the process group spanned by ``axes`` of the mesh.

    Ranks are laid out row-major over the mesh (last axis fastest) and packed
    ``gpus_per_node`` to a node. Every group along the same axes has the same
    shape, so we inspect the one holding rank 0. ``p * m`` equals the product
    of the axes' sizes.
    """
    if not mesh_shape or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in mesh_shape
    ):
        raise PlanError(f"mesh_shape {mesh_shape!r} must be a non-empty tuple of ints >= 1.")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise PlanError(f"gpus_per_node ({gpus_per_node!r}) must be an int >= 1.")
    if len(set(axes)) != len(axes) or any(
        isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(mesh_shape) for a in axes
    ):
        raise PlanError(
            f"axes {axes!r} must be distinct mesh axes in 0..{len(mesh_shape) - 1} "
            f"for mesh_shape {mesh_shape!r}."
        )
    strides = [math.prod(mesh_shape[i + 1 :]) for i in range(len(mesh_shape))]
    ranks = [0]
    for axis in axes:
        ranks = [r + k * strides[axis] for r in ranks for k in range(mesh_shape[axis])]
    per_node: dict[int, int] = {}
    for rank in ranks:
        per_node[rank // gpus_per_node] = per_node.get(rank // gpus_per_node, 0) + 1
    counts = set(per_node.values())
    if len(counts) != 1:
        raise PlanError(
            f"The group over axes {axes!r} of mesh {mesh_shape!r} puts {sorted(per_node.values())} "
            f"ranks on its nodes ({gpus_per_node} GPUs per node); a priced group needs the same "
            "count on every node. Choose a mesh whose inner axes divide gpus_per_node."
        )
    return counts.pop(), len(per_node)
