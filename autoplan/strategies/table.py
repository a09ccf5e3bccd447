"""Data model of the strategies stage: what a node may do, and which tensors it reads.

A :class:`Strategy` fixes the placements of a node's outputs and the
placements its tensor inputs must arrive in. A :class:`NodeStrategies` lists a
node's candidates plus the metadata later stages need (shapes, dtypes, which
producer output feeds each input slot). The :class:`StrategyTable` is the
frozen result of the stage, in topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.core.placements import Placements, fmt


@dataclass(frozen=True)
class TensorInfo:
    """Global shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype_bytes: int
    dtype: str


@dataclass(frozen=True)
class InputRef:
    """Input slot of a node: produced by ``node``'s output number ``index``."""

    node: str
    index: int


@dataclass(frozen=True)
class Strategy:
    """Output placements (one per output; None for an absent output) and input placements."""

    outs: tuple[Placements | None, ...]
    ins: tuple[Placements, ...]

    def out(self, i: int = 0) -> Placements:
        """The placements of output ``i``, one the caller knows is a tensor."""
        placements = self.outs[i]
        assert placements is not None, f"output {i} of strategy {self} is absent"
        return placements

    def __str__(self) -> str:
        ins = ", ".join(fmt(p) for p in self.ins)
        outs = ", ".join(fmt(p) for p in self.outs)
        return f"({ins}) -> {outs}"


@dataclass(frozen=True)
class NodeStrategies:
    """Candidate strategies of one graph node."""

    name: str
    op: str
    kind: str  # "param" | "buffer" | "input" | "tangent" (an output's cotangent) | "op"
    inputs: tuple[InputRef, ...]
    in_tensors: tuple[TensorInfo, ...]
    out_tensors: tuple[TensorInfo | None, ...]
    strategies: tuple[Strategy, ...]
    fallback: bool = False
    free: bool = False  # a view/alias: no kernel time
    pointwise: bool = False  # an elementwise op: output placement follows an input


@dataclass(frozen=True)
class StrategyTable:
    """Per-node candidate strategies for a traced graph on one mesh."""

    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    nodes: dict[str, NodeStrategies]
    fallback_ops: tuple[str, ...] = field(default=())

    @property
    def num_strategies(self) -> int:
        return sum(len(n.strategies) for n in self.nodes.values())
