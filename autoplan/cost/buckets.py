"""Bucketed collectives: which of a plan's moves run merged, and what they cost merged.

Stage: ``cost/``, after the solve (read out into the plan) and at lowering (the same
rule decides what ``parallelize`` merges). Input: the chosen strategies' priced moves
in the order a step issues them. Output: the buckets, each priced as one collective
of the members' summed size, and the backward's tail buckets with the flat buffer each
holds (:func:`tail_buckets`, for the backward's peak memory).

Why: a parameter's gather that reads nothing computed (the forward's *head*) and a
gradient's reduction that feeds only the optimizer (the backward's *tail*) can run
merged with their neighbours without delaying any compute, as DDP's gradient buckets
and FSDP2's per-block gathers do; one collective then pays one launch latency instead
of one per member. The ILP prices each move alone (an upper bound on the merged
price); the plan reports the buckets and their price, and the lowered step runs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from autoplan.cost.compute import ComputeModel
from autoplan.cost.price import TANGENT_SLOT, CostTable, EdgeCost
from autoplan.cost.redistribute import RedistributeModel, Step
from autoplan.trace.capture import TracedGraph

__all__ = [
    "GRAD_SLOT",
    "RESHAPING",
    "Charged",
    "Merged",
    "Step",
    "TailBucket",
    "bucket_groups",
    "copies_us",
    "member_bytes",
    "member_copies_us",
    "grad_tail",
    "merged_moves",
    "op_name",
    "param_derived",
    "plan_buckets",
    "tail_buckets",
]

GRAD_SLOT = -1  # the edge moving a gradient to its parameter's placement
# a move's steps as the objective priced them: (edge, redist, row, column) -> steps
Charged = Callable[[EdgeCost, RedistributeModel, int, int], list[Step]]
MERGEABLE = frozenset({"all_reduce", "all_gather", "reduce_scatter"})  # one flat buffer each
# ops that only reshape, cast or regroup a value: a collective whose result reaches the
# gradients through these alone delays no compute when merged with later ones
RESHAPING = frozenset(
    {
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "squeeze",
        "unsqueeze", "alias", "detach", "clone", "_to_copy", "split", "split_with_sizes",
        "cat", "getitem", "slice",
    }
)  # fmt: skip


def op_name(target: object) -> str:
    """``view`` for ``aten.view.default``, ``getitem`` for ``operator.getitem``."""
    return str(getattr(target, "__name__", target)).split(".")[0]


def bucket_groups(
    keys: Sequence[Hashable], sizes: Sequence[float], upstream: Sequence[int], cap: float
) -> list[list[int]]:
    """Items (in issue order) merged per key, each bucket filled greedily up to ``cap``
    bytes; an item whose input depends on a member of an open bucket (``upstream[i]``:
    the bit set of the items it reads) closes that bucket first, so a bucket reads only
    earlier buckets. Returns every bucket (single items too), ordered by first member."""
    open_: dict[Hashable, list[int]] = {}
    size: dict[Hashable, float] = {}
    bits: dict[Hashable, int] = {}
    closed: list[list[int]] = []
    for i, (key, n) in enumerate(zip(keys, sizes, strict=True)):
        for k in [k for k in open_ if bits[k] & upstream[i] or (k == key and size[k] + n > cap)]:
            closed.append(open_.pop(k))
        if key not in open_:
            open_[key], size[key], bits[key] = [], 0.0, 0
        open_[key].append(i)
        size[key] += n
        bits[key] |= 1 << i
    closed.extend(open_.values())
    return sorted(closed, key=lambda g: g[0])


@dataclass(frozen=True)
class _Move:
    order: tuple[int, int, int, int]  # where the step issues it
    where: str  # "head" or "tail"
    program: str  # "forward" or "backward"
    kind: str
    axes: tuple[int, ...]
    nbytes: float
    us: float
    dtype_bytes: int
    edge: int  # index of its edge, for dependencies
    hop: int


@dataclass(frozen=True)
class TailBucket:
    """Backward collectives that feed only the gradients, run as one over a flat buffer
    that holds every member's input from the first member's on (as lowering fills it):
    each member moves the value of ``edges[i]`` (its source, destination and slot)."""

    kind: str
    edges: tuple[tuple[str, str, int], ...]
    in_bytes: float  # the flat buffer: the members' inputs
    out_bytes: float  # the members' results


@dataclass(frozen=True)
class Merged:
    """The moves of a chosen plan that run merged (:func:`merged_moves`): each bucket's
    place (``"head"`` or ``"tail"``) and its members, in issue order."""

    buckets: tuple[tuple[str, tuple[_Move, ...]], ...]


def merged_moves(
    traced: TracedGraph,
    costs: CostTable,
    redist: RedistributeModel,
    choice: dict[str, int],
    cap_bytes: float,
    charged: Charged | None = None,
) -> Merged:
    """The buckets of two or more moves the chosen plan's head and tail moves run in.
    ``charged`` gives a move's steps as the objective priced them (default: each alone,
    :meth:`~autoplan.cost.price.EdgeCost.route_steps`); a move it charged other than its price
    alone that runs alone is listed too, as a bucket of one, so that the plan's estimate
    pays its whole launch."""
    found = _merged(traced, costs, redist, choice, cap_bytes, charged)
    return Merged(tuple((w, tuple(ms)) for w, ms in found))


def plan_buckets(
    merged: Merged, redist: RedistributeModel, compute: ComputeModel
) -> list[dict[str, Any]]:
    """The buckets as the plan records them, each with its member count, bytes, merged
    price (``us``: its collective and its copies, :func:`copies_us`) and the members'
    summed price (``us_alone``)."""
    out: list[dict[str, Any]] = []
    for where, members in merged.buckets:
        first = members[0]
        nbytes = sum(m.nbytes for m in members)
        p, m = redist.span(first.axes)
        us = redist.collectives.time_us(first.kind, nbytes, p, m)
        if len(members) > 1:
            inputs, outputs = _member_bytes(members, redist.mesh_shape)
            us += copies_us(where, first.kind, inputs, outputs, compute)
        out.append(
            {
                "kind": first.kind,
                "where": where,
                "axes": tuple(first.axes),
                "members": len(members),
                "bytes": nbytes,
                "us": us,
                "us_alone": sum(x.us for x in members),
            }
        )
    return out


def copies_us(
    where: str, kind: str, inputs: Sequence[float], outputs: Sequence[float], compute: ComputeModel
) -> float:
    """What a bucket of two or more members runs besides its collective: the sum of its
    members' :func:`member_copies_us`."""
    total = sum(inputs)
    return sum(
        member_copies_us(where, kind, i, o, compute, i / total if total else 0.0)
        for i, o in zip(inputs, outputs, strict=True)
    )


def member_copies_us(
    where: str, kind: str, in_bytes: float, out_bytes: float, compute: ComputeModel, share: float
) -> float:
    """A member's part of the copies and views its bucket runs, as
    :mod:`autoplan.runtime.bucket_program` lowers it. A tail bucket allocates its flat
    buffer and copies each member's input into it (a reshape, a view, a slice and the
    copy); a head bucket concatenates the inputs (a reshape each, one concatenation and a
    view). A member pays ``share`` of the one-off ops. Each member's result is a slice
    and a view of the flat result; an all_gather's also a copy (a column block of every
    rank's row), after a view of the whole."""
    view = compute.view_us
    if where == "tail":
        us = compute.copy_us(in_bytes) + 3 * view + compute.copy_us(0.0, launches=share)
    else:
        us = compute.copy_us(in_bytes, launches=share) + (1 + share) * view
    us += 2 * view
    if kind == "all_gather":
        us += compute.copy_us(out_bytes) + share * view
    return us


def member_bytes(kind: str, nbytes: float, ranks: int) -> tuple[float, float]:
    """A move's input and result bytes on one rank: its ``nbytes`` is its collective's
    size (an all_gather's result, a reduce_scatter's input) over a group of ``ranks``."""
    return (
        nbytes / ranks if kind == "all_gather" else nbytes,
        nbytes / ranks if kind == "reduce_scatter" else nbytes,
    )


def _member_bytes(
    members: Sequence[_Move], mesh_shape: Sequence[int]
) -> tuple[list[float], list[float]]:
    """Each member's :func:`member_bytes`, as two lists."""
    size = math.prod(mesh_shape[a] for a in members[0].axes)
    pairs = [member_bytes(m.kind, m.nbytes, size) for m in members]
    return [i for i, _ in pairs], [o for _, o in pairs]


def tail_buckets(merged: Merged, costs: CostTable, mesh_shape: tuple[int, ...]) -> list[TailBucket]:
    """The backward's tail buckets, with the edges of ``costs`` whose moves they merge
    and their flat buffer's bytes (a bucket of one runs without a flat buffer)."""
    out = []
    for where, members in merged.buckets:
        if where != "tail" or len(members) < 2:
            continue
        inputs, outputs = _member_bytes(members, mesh_shape)
        edges = tuple(
            (costs.edges[m.edge].src, costs.edges[m.edge].dst, costs.edges[m.edge].slot)
            for m in members
        )
        out.append(TailBucket(members[0].kind, edges, sum(inputs), sum(outputs)))
    return out


def _merged(
    traced: TracedGraph,
    costs: CostTable,
    redist: RedistributeModel,
    choice: dict[str, int],
    cap_bytes: float,
    charged: Charged | None,
) -> list[tuple[str, list[_Move]]]:
    """Each bucket of two or more moves (or of one charged other than its price alone):
    ``"head"`` or ``"tail"``, and its members."""
    if cap_bytes <= 0:
        return []
    nodes = list(traced.gm.graph.nodes)
    position = {n.name: i for i, n in enumerate(nodes)}
    moved = {
        (e.src, e.dst)
        for e in costs.edges
        if float(e.cost[e.src_group[choice[e.src]], e.dst_group[choice[e.dst]]]) > 0.0
    }
    head_nodes = param_derived(traced, moved)
    forward = _forward(traced)
    tail_nodes = grad_tail(traced)
    moves: list[_Move] = []
    for k, e in enumerate(costs.edges):
        if e.slot == TANGENT_SLOT or e.tensor is None:
            continue
        r, c = e.src_group[choice[e.src]], e.dst_group[choice[e.dst]]
        if float(e.cost[r, c]) == 0.0:
            continue
        if e.slot == GRAD_SLOT:  # moved just after the gradient is computed
            order, where = (position[e.src], 1, 0, k), "tail"
        else:
            order = (position[e.dst], 0, e.slot, k)
            where = "tail" if e.dst in tail_nodes else "head" if e.src in head_nodes else ""
        if not where:
            continue
        steps = charged(e, redist, r, c) if charged else e.route_steps(redist, r, c)
        for hop, (kind, axes, nbytes, us) in enumerate(steps):
            if where == "head" and hop > 0:
                break  # a later hop reads the first one's result: not a head collective
            if kind not in MERGEABLE:
                continue
            program = "forward" if e.slot != GRAD_SLOT and e.dst in forward else "backward"
            moves.append(
                _Move(order, where, program, kind, axes, nbytes, us, e.tensor.dtype_bytes, k, hop)
            )
    out: list[tuple[str, list[_Move]]] = []
    # each program merges its own collectives: its head ones, then its tail ones
    for where, program in (("head", "forward"), ("head", "backward"), ("tail", "backward")):
        items = sorted(
            (m for m in moves if (m.where, m.program) == (where, program)),
            key=lambda m: (m.order, m.hop),
        )
        upstream = _upstream(traced, costs, items) if where == "tail" else [0] * len(items)
        keys = [(m.kind, m.axes, m.dtype_bytes) for m in items]
        for group in bucket_groups(keys, [m.nbytes for m in items], upstream, cap_bytes):
            if len(group) > 1 or (charged and _charged_otherwise(items[group[0]], redist)):
                out.append((where, [items[i] for i in group]))
    return out


def _charged_otherwise(move: _Move, redist: RedistributeModel) -> bool:
    """Whether ``move`` was charged other than what it costs run alone (a share of a
    launch, and of the copies, that it runs without)."""
    p, m = redist.span(move.axes)
    alone = redist.collectives.time_us(move.kind, move.nbytes, p, m)
    return not math.isclose(move.us, alone, rel_tol=1e-9)


def param_derived(traced: TracedGraph, moved: set[tuple[str, str]]) -> set[str]:
    """Nodes computed from parameters alone, with no move on the way (their values are
    ready before the step computes anything)."""
    derived = set(traced.params)
    for node in traced.gm.graph.nodes:
        ins = node.all_input_nodes
        if (
            node.op == "call_function"
            and ins
            and all(i.name in derived and (i.name, node.name) not in moved for i in ins)
        ):
            derived.add(node.name)
    return derived


def _forward(traced: TracedGraph) -> set[str]:
    """The ancestors of the model's outputs: the forward program's nodes."""
    seen: set[str] = set()
    stack = [traced.node(o) for o in traced.outputs]
    while stack:
        node = stack.pop()
        if node.name not in seen:
            seen.add(node.name)
            stack.extend(node.all_input_nodes)
    return seen


def grad_tail(traced: TracedGraph) -> set[str]:
    """Reshaping nodes through which alone a value reaches gradients (a move into one is
    a gradient's, like the move to the parameter's placement)."""
    grads, outputs = set(traced.grads.values()), set(traced.outputs)
    tail: set[str] = set()
    for node in reversed(traced.gm.graph.nodes):
        if node.op != "call_function" or node.name in outputs or not node.users:
            continue
        if op_name(node.target) in RESHAPING and all(
            u.name in tail or (u.op == "output" and node.name in grads) for u in node.users
        ):
            tail.add(node.name)
    return tail


def _upstream(traced: TracedGraph, costs: CostTable, items: list[_Move]) -> list[int]:
    """Per tail move, the bit set of the tail moves whose results its input reads."""
    into: dict[str, int] = {}  # node -> bits of the moves into it (their results it reads)
    by_edge: dict[int, list[int]] = {}
    for i, m in enumerate(items):
        by_edge.setdefault(m.edge, []).append(i)
        e = costs.edges[m.edge]
        if e.slot != GRAD_SLOT:
            into[e.dst] = into.get(e.dst, 0) | 1 << i
    reads: dict[str, int] = {}
    for node in traced.gm.graph.nodes:
        bits = into.get(node.name, 0)
        for i in node.all_input_nodes:
            bits |= reads.get(i.name, 0)
        reads[node.name] = bits
    out = []
    for m in items:
        earlier = sum(1 << j for j in by_edge[m.edge] if items[j].hop < m.hop)
        out.append(reads.get(costs.edges[m.edge].src, 0) | earlier)
    return out
