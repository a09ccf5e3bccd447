"""Measured prices: the collective fits and the provenance of a calibrated topology.

Stage: input to ``cost/`` beside :mod:`autoplan.core.topology`; written by
``autoplan calibrate`` (:mod:`autoplan.calibrate`), read from a topology YAML.
Inputs: the ``collectives`` and ``calibration`` mappings of a topology file.
Outputs: frozen :class:`CollectiveFits` (one :class:`LinkFit` per link class and op) and
:class:`Calibration` (when, where and how well the figures were measured); and
:func:`measured_time_us`, the price of a collective its fit covers, which
:mod:`autoplan.cost.collectives` takes before its NCCL-style model.
Why: a datasheet prices a GPU that may not be the one running the plan; a job's own
measured collectives are its real prices. A fit is the ring model every collective
library's tuner starts from, ``t = latency + step x (n - 1) + bytes x busfactor(n) /
busbw``, with nccl-tests' bus factor (``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for the
others), so one fit prices a group of any size on its link class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoplan.core.errors import PlanError

__all__ = [
    "FORMAT",
    "LINKS",
    "MEASURED_CHOICE",
    "OPS",
    "Calibration",
    "CollectiveFits",
    "LinkFit",
    "bus_factor",
    "measured_time_us",
]

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
LINKS = ("intra", "inter")
"""Link classes: a group inside one node, and a group across nodes."""
FORMAT = 1
"""The calibration format this version reads and writes."""
MEASURED_CHOICE = ("Measured", "fit")
"""The (algorithm, protocol) reported for a collective priced by its measured fit."""


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor: the share of ``bytes`` each rank's link carries."""
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    return (ranks - 1) / ranks


def _number(where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{where} ({value!r}) must be a finite number.")
    if value < 0 or (positive and value == 0):
        raise PlanError(f"{where} ({value}) must be {'> 0' if positive else '>= 0'}.")
    return float(value)


def _mapping(where: str, value: Any, allowed: tuple[str, ...] | None = None) -> Mapping:
    if not isinstance(value, Mapping):
        raise PlanError(f"{where} must be a mapping, got {value!r}.")
    if allowed is not None:
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise PlanError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}.")
    return value


@dataclass(frozen=True)
class LinkFit:
    """One op's measured cost on one link class."""

    latency_us: float
    """Fixed cost of a call, us."""
    step_us: float
    """Cost of each further rank in the group (a ring takes n - 1 steps), us."""
    busbw_gbps: float
    """Bus bandwidth, GB/s (nccl-tests' busbw)."""

    def __post_init__(self) -> None:
        _number("LinkFit.latency_us", self.latency_us)
        _number("LinkFit.step_us", self.step_us)
        _number("LinkFit.busbw_gbps", self.busbw_gbps, positive=True)

    def time_us(self, op: str, nbytes: float, ranks: int) -> float:
        """Microseconds for ``op`` on ``nbytes`` (nccl-tests' size) over ``ranks`` ranks."""
        if ranks <= 1 or nbytes == 0:
            return 0.0
        wire = nbytes * bus_factor(op, ranks) / (self.busbw_gbps * 1e3)  # GB/s = 1e3 B/us
        return self.latency_us + self.step_us * (ranks - 1) + wire

    def to_dict(self) -> dict[str, float]:
        return {
            "latency_us": self.latency_us,
            "step_us": self.step_us,
            "busbw_gbps": self.busbw_gbps,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LinkFit:
        fields = ("latency_us", "step_us", "busbw_gbps")
        d = _mapping(where, d, fields)
        missing = [k for k in fields if k not in d]
        if missing:
            raise PlanError(f"{where} is missing {', '.join(missing)}.")
        return cls(*(_number(f"{where}.{k}", d[k], positive=k == "busbw_gbps") for k in fields))


@dataclass(frozen=True)
class CollectiveFits:
    """Measured collectives per link class; an op or link left out is priced by the
    NCCL-style model of :mod:`autoplan.cost.collectives` (a one-node calibration says
    nothing about the network). ``sync_us`` is what a collective waited for right after
    compute adds to its fit: the ranks reach it at different moments (on ranks sharing
    cores, by a scheduler's time slices), and the first to arrive waits for the last.
    ``skew`` is how much that wait grows per microsecond of compute since the ranks last
    met: they drift apart as they compute, so a step's compute is priced ``1 + skew``
    times its ops' sum (:mod:`autoplan.cost.compute`)."""

    intra: tuple[tuple[str, LinkFit], ...] = ()
    inter: tuple[tuple[str, LinkFit], ...] = ()
    sync_us: float = 0.0
    skew: float = 0.0

    def __post_init__(self) -> None:
        _number("CollectiveFits.sync_us", self.sync_us)
        _number("CollectiveFits.skew", self.skew)

    def fit(self, op: str, nodes: int) -> LinkFit | None:
        """The fit for ``op`` on a group spanning ``nodes`` nodes, if measured."""
        return dict(self.intra if nodes == 1 else self.inter).get(op)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for link in LINKS:
            ops = getattr(self, link)
            if ops:
                out[link] = {op: f.to_dict() for op, f in ops}
        if self.sync_us:
            out["sync_us"] = round(self.sync_us, 1)
        if self.skew:
            out["skew"] = round(self.skew, 4)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str = "collectives") -> CollectiveFits:
        d = _mapping(where, d, (*LINKS, "sync_us", "skew"))
        links: dict[str, Any] = {}
        for link, ops in d.items():
            if link in ("sync_us", "skew"):
                continue
            ops = _mapping(f"{where}.{link}", ops, OPS)
            links[link] = tuple(
                (op, LinkFit.from_dict(fit, f"{where}.{link}.{op}")) for op, fit in ops.items()
            )
        if not links:
            raise PlanError(f"{where} is empty; give at least one link class ({', '.join(LINKS)}).")
        sync = _number(f"{where}.sync_us", d["sync_us"]) if "sync_us" in d else 0.0
        skew = _number(f"{where}.skew", d["skew"]) if "skew" in d else 0.0
        return cls(**links, sync_us=sync, skew=skew)


def measured_time_us(
    fits: CollectiveFits | None, op: str, nbytes: float, ranks_per_node: int, nodes: int
) -> float | None:
    """Microseconds for ``op`` on ``nbytes`` over a ``ranks_per_node`` x ``nodes`` group, from
    its measured fit, run alone (the arrival wait, ``sync_us``, is the caller's to add: it
    is paid by every collective, fitted or not); ``None`` when the topology measured no fit
    for that op and link class, so that the caller prices it with the NCCL-style model."""
    if fits is None or (fit := fits.fit(op, nodes)) is None:
        return None
    return fit.time_us(op, nbytes, ranks_per_node * nodes)


@dataclass(frozen=True)
class Calibration:
    """Where a topology's figures come from: when, on what, and how well they fit."""

    date: str
    """When it was measured (ISO 8601)."""
    torch: str
    """``torch.__version__`` of the measuring job."""
    backend: str
    """The process group backend measured (``gloo``, ``nccl``)."""
    mesh: tuple[int, ...]
    """The mesh shape measured."""
    names: tuple[str, ...]
    """Its axis names."""
    errors: tuple[tuple[str, float], ...] = ()
    """The fit's median relative error per kind (``intra.all_reduce``, ``matmul``, ...)."""
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "date": self.date,
            "torch": self.torch,
            "backend": self.backend,
            "mesh": list(self.mesh),
            "names": list(self.names),
            "errors": dict(self.errors),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "calibration") -> Calibration:
        keys = ("format", "date", "torch", "backend", "mesh", "names", "errors")
        d = _mapping(where, d, keys)
        fmt = d.get("format")
        if fmt != FORMAT:
            raise PlanError(
                f"{where}.format is {fmt!r}; this autoplan reads calibration format {FORMAT}. "
                "Re-run `autoplan calibrate` with this version to write the file again."
            )
        missing = [k for k in keys if k not in d and k != "errors"]
        if missing:
            raise PlanError(f"{where} is missing {', '.join(missing)}.")
        for k in ("date", "torch", "backend"):
            if not isinstance(d[k], str) or not d[k]:
                raise PlanError(f"{where}.{k} ({d[k]!r}) must be a non-empty string.")
        mesh, names = d["mesh"], d["names"]
        if (
            not isinstance(mesh, list)
            or not mesh
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in mesh)
        ):
            raise PlanError(f"{where}.mesh ({mesh!r}) must be a list of ints >= 1.")
        if not isinstance(names, list) or len(names) != len(mesh):
            raise PlanError(f"{where}.names ({names!r}) must name each of the {len(mesh)} axes.")
        errors = _mapping(f"{where}.errors", d.get("errors", {}))
        return cls(
            date=d["date"],
            torch=d["torch"],
            backend=d["backend"],
            mesh=tuple(mesh),
            names=tuple(str(n) for n in names),
            errors=tuple((str(k), _number(f"{where}.errors.{k}", v)) for k, v in errors.items()),
        )
