"""Stage 7, bucket: merge a lowered program's parameter-side collectives into few large ones.

Input: one program of a :class:`~autoplan.runtime.lower.LoweredStep` (an ``fx.Graph`` of local
aten ops and ``_c10d_functional`` collectives, each followed by its ``wait_tensor``) and
a byte cap. Output: the same graph, rewritten in place, where collectives of the same
kind, group and dtype that no compute waits on in between run as one collective over a
flat buffer (the inputs copied in, the results sliced out), and the list of the
:class:`Bucket` s made.

Why: every collective pays a launch and a latency whatever its size, so a step that
reduces each gradient alone, or gathers each parameter alone, is slower than PyTorch's
own wrappers on the same placements: DDP reduces gradients in 25 MiB buckets and FSDP2
gathers a block's parameters at once. Two classes are safe to merge without moving any
compute across a collective, and only they are merged:

- *head* collectives of the forward program, whose input is computed from the
  parameters alone (a parameter's gather): a bucket is issued one bucket ahead of where
  its first result is read (the next block's gather runs while the current one
  computes, as FSDP2's prefetch), its inputs computed at the top of the program;
- *tail* collectives of the backward program, whose result feeds only the gradients (a
  gradient's reduction): a bucket is issued where its last member was, so a full bucket
  reduces while the backward goes on (DDP's order).

Every rank makes the same buckets: the grouping depends only on the order, kinds and
sizes of the collectives, which are the same on every rank (a collective's input has
the same size everywhere).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch
from torch import fx

from autoplan.core.graph import arg_int, arg_node, node_op, tensor_val
from autoplan.core.torch_adapter import mutates
from autoplan.cost.buckets import RESHAPING, bucket_groups, op_name

__all__ = [
    "Bucket",
    "bucket_collectives",
    "bucket_fill",
    "impure_except_collectives",
    "param_derived",
]

_OPS = torch.ops._c10d_functional
_WAIT = _OPS.wait_tensor.default
_REDUCE = _OPS.all_reduce.default
_REDUCE_INPLACE = _OPS.all_reduce_.default
_GATHER = _OPS.all_gather_into_tensor.default
_SCATTER = _OPS.reduce_scatter_tensor.default
_KIND = {_REDUCE: "all_reduce", _GATHER: "all_gather", _SCATTER: "reduce_scatter"}
_aten = torch.ops.aten


@dataclass(frozen=True)
class Bucket:
    """Collectives of one kind and group run as one: ``members`` of them, ``nbytes`` in all."""

    kind: str  # plan.comm's vocabulary
    where: str  # "head" (issued ahead of its readers) or "tail" (feeds outputs only)
    members: int
    nbytes: int


def bucket_collectives(
    graph: fx.Graph,
    cap_bytes: int,
    *,
    head_from: Collection[str] = (),
    tail: bool = False,
    in_place: bool = True,
) -> list[Bucket]:
    """Merge ``graph``'s collectives into buckets of at most ``cap_bytes`` (a collective
    larger than the cap stays alone); returns the buckets made.

    Head collectives are those computed from the placeholders ``head_from`` alone (the
    parameters, or the values the forward computed from them alone); with ``tail`` (a
    backward program, whose outputs are gradients) the collectives whose results feed
    only the outputs are merged too, and are not head ones. The rule is
    :func:`autoplan.cost.buckets.bucket_groups`, the one the plan is priced by. An
    all-reduce bucket runs in place on its flat buffer, and a tail bucket's inputs are
    copied into it as each is computed, unless ``in_place`` is false (for
    ``torch.compile``: its functionalization refuses an in-place collective and makes
    each copy into a slice a copy of the whole buffer, while Inductor writes a
    concatenation's inputs straight into its output).
    """
    if cap_bytes <= 0:
        return []
    made: list[Bucket] = []
    if head_from:
        head = _head(graph, set(head_from))
        outputs_only = _tail(graph) if tail else set()
        made += _merge_all(
            graph,
            cap_bytes,
            lambda c, w: c.args[0] in head and w not in outputs_only,
            head,
            in_place,
        )
    if tail:
        outputs_only = _tail(graph)
        made += _merge_all(graph, cap_bytes, lambda c, w: w in outputs_only, None, in_place)
    return made


def _merge_all(
    graph: fx.Graph,
    cap_bytes: int,
    member: Callable[[fx.Node, fx.Node], bool],
    head: set[fx.Node] | None,
    in_place: bool,
) -> list[Bucket]:
    """One pass: the collectives ``member`` selects, grouped and merged; head buckets
    (``head`` given) issued one bucket ahead, tail buckets at their last member."""
    waits: dict[fx.Node, fx.Node] = {}
    for c in graph.nodes:
        if c.target in _KIND and (w := _only_wait(c)) is not None:
            if tensor_val(c.args[0]) is not None:
                waits[c] = w
    members = [c for c, w in waits.items() if member(c, w)]
    upstream = _upstream(graph, members)
    keys = [_key(c) for c in members]
    sizes = [_size(c) for c in members]
    groups = [
        [members[i] for i in g]
        for g in bucket_groups(keys, sizes, upstream, cap_bytes)
        if len(g) > 1
    ]
    if not groups:
        return []
    made = [_describe(g, "head" if head is not None else "tail") for g in groups]
    priority: dict[fx.Node, float] = {}
    if head is not None:
        # the inputs of head buckets are computed first, at the top of the program
        priority = dict.fromkeys(_ancestors_in([c for g in groups for c in g], head), -1.0)
        ahead = next(n for n in graph.nodes if n.op != "placeholder")
        for group in groups:
            index = _index(graph)
            readers = [u for c in group for u in waits[c].users]
            own = min(readers, key=index.__getitem__, default=ahead)
            # issued one bucket ahead: where the previous bucket's first result is read
            _merge(
                graph,
                group,
                waits,
                before=min(ahead, own, key=index.__getitem__),
                tail=False,
                in_place=in_place,
            )
            ahead = own
    else:
        for group in groups:  # issued where its last member was
            _merge(graph, group, waits, before=group[-1], tail=True, in_place=in_place)
    _reorder(graph, priority)
    graph.eliminate_dead_code(is_impure_node=impure_except_collectives)
    graph.lint()
    return made


def _only_wait(collective: fx.Node) -> fx.Node | None:
    users = list(collective.users)
    return users[0] if len(users) == 1 and users[0].target is _WAIT else None


def _input(collective: fx.Node) -> torch.Tensor:
    """A member's traced input (every member has one: ``_merge_all`` keeps no other)."""
    val = tensor_val(collective.args[0])
    assert val is not None
    return val


def _nbytes(collective: fx.Node) -> int:
    val = _input(collective)
    return val.numel() * val.element_size()


def param_derived(graph: fx.Graph, params: Collection[str]) -> set[str]:
    """The names of the nodes computed from the placeholders ``params`` alone."""
    return {n.name for n in _head(graph, set(params))}


def _head(graph: fx.Graph, params: set[str]) -> set[fx.Node]:
    """Nodes computed from the parameter placeholders alone, by pure non-collective ops."""
    head: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name in params:
                head.add(node)
        elif (
            node.op == "call_function"
            and getattr(node.target, "namespace", None) != "_c10d_functional"
            and not node.is_impure()
            and node.all_input_nodes
            and all(i in head for i in node.all_input_nodes)
        ):
            head.add(node)
    return head


def _tail(graph: fx.Graph) -> set[fx.Node]:
    """Collective results that reach the program's outputs through reshaping ops alone
    (:data:`autoplan.cost.buckets.RESHAPING`)."""
    chain: set[fx.Node] = set()  # reshaping nodes that lead to outputs only
    for node in reversed(graph.nodes):
        if (
            node.op == "call_function"
            and op_name(node.target) in RESHAPING
            and node.users
            and all(u.op == "output" or u in chain for u in node.users)
        ):
            chain.add(node)
    return {
        n
        for n in graph.nodes
        if n.target is _WAIT and n.users and all(u.op == "output" or u in chain for u in n.users)
    }


def _key(collective: fx.Node) -> tuple[object, ...]:
    return (collective.target, *collective.args[1:], _input(collective).element_size())


def _size(collective: fx.Node) -> int:
    """The collective's size as the cost model counts it (an all_gather's: its output)."""
    n = _nbytes(collective)
    return n * arg_int(collective, 1) if collective.target is _GATHER else n  # group_size


def _upstream(graph: fx.Graph, collectives: list[fx.Node]) -> list[int]:
    """Per collective, the bit set of the listed collectives whose results reach its input."""
    waited = {next(iter(c.users)): 1 << i for i, c in enumerate(collectives)}
    mask: dict[fx.Node, int] = {}
    for node in graph.nodes:
        m = 0
        for i in node.all_input_nodes:
            m |= mask[i]
        mask[node] = m | waited.get(node, 0)
    return [mask[arg_node(c, 0)] for c in collectives]


def _describe(group: list[fx.Node], where: str) -> Bucket:
    return Bucket(_KIND[node_op(group[0])], where, len(group), sum(_size(c) for c in group))


def _merge(
    graph: fx.Graph,
    group: list[fx.Node],
    waits: dict[fx.Node, fx.Node],
    before: fx.Node,
    *,
    tail: bool,
    in_place: bool,
) -> list[fx.Node]:
    """One collective for ``group``, inserted before ``before``; each member's wait is
    replaced by its slice of the result. Returns the slices."""
    target, extra = node_op(group[0]), tuple(group[0].args[1:])
    # each reduce-scatter input [g * k, ...] as g rows [g, k...]: rank r's share in row r
    rows = arg_int(group[0], 2) if target is _SCATTER else 1  # its group_size
    ranks = arg_int(group[0], 1) if target is _GATHER else 1  # an all_gather's group_size
    fn = graph.call_function
    fill = tail and in_place
    if fill:
        flat = _fill_as_computed(graph, group, rows)
    with graph.inserting_before(before):
        if not fill:
            parts = [fn(_aten.reshape.default, (c.args[0], [rows, -1])) for c in group]
            flat = fn(_aten.view.default, (fn(_aten.cat.default, (parts, 1)), [-1]))
        # an all-reduce runs in place on the flat buffer, which nothing else reads
        op = _REDUCE_INPLACE if target is _REDUCE and in_place else target
        done = fn(_WAIT, (fn(op, (flat, *extra)),))
        if target is _GATHER:  # [g * total] as [g, total]: rank r's inputs in row r
            done = fn(_aten.view.default, (done, [ranks, -1]))
        pieces, offset = [], 0
        for c in group:
            out = tensor_val(waits[c])
            assert out is not None
            # an all_gather's piece is a column block of every rank's row
            width = out.numel() // ranks if target is _GATHER else out.numel()
            piece = fn(
                _aten.slice.Tensor, (done, 1 if target is _GATHER else 0, offset, offset + width)
            )
            offset += width
            if target is _GATHER:
                piece = fn(
                    _aten.clone.default, (piece,), {"memory_format": torch.contiguous_format}
                )
            piece = fn(_aten.view.default, (piece, list(out.shape)))
            piece.meta["val"] = out
            pieces.append(piece)
    for c, piece in zip(group, pieces, strict=True):
        waits[c].replace_all_uses_with(piece)
        graph.erase_node(waits[c])
        graph.erase_node(c)
    return pieces


def bucket_fill(flat: torch.Tensor, rows: int, offset: int, x: torch.Tensor) -> torch.Tensor:
    """Copy ``x``, as ``rows`` rows, into the columns from ``offset`` of ``flat`` seen as
    ``rows`` rows; returns ``flat`` (the next fill and the collective take it from here,
    which orders them after this copy)."""
    part = x.reshape(rows, -1)
    flat.view(rows, -1)[:, offset : offset + part.shape[1]].copy_(part)
    return flat


def _fill_as_computed(graph: fx.Graph, group: list[fx.Node], rows: int) -> fx.Node:
    """A flat buffer for a tail bucket, each member's input copied in right after it is
    computed: while still in cache (a copy of them all at the end reads them back from
    memory), as DDP copies each gradient into its bucket when autograd makes it."""
    inputs = [arg_node(c, 0) for c in group]
    sizes = [_input(c).numel() for c in group]
    index = _index(graph)  # inserting nodes keeps the order of those already there
    anchor = min(inputs, key=index.__getitem__)
    with graph.inserting_after(anchor):
        last = graph.call_function(_aten.new_empty.default, (anchor, [sum(sizes)]))
    offset = 0
    for x, size in zip(inputs, sizes, strict=True):
        # after the input, or after the previous fill if that comes later
        where = x if index[x] > index[anchor] else last
        anchor = max(x, anchor, key=index.__getitem__)
        with graph.inserting_after(where):
            last = graph.call_function(bucket_fill, (last, rows, offset, x))
        offset += size // rows
    return last


def _index(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _ancestors_in(group: Iterable[fx.Node], within: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [c.args[0] for c in group]
    while stack:
        node = stack.pop()
        if isinstance(node, fx.Node) and node in within and node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _reorder(graph: fx.Graph, priority: dict[fx.Node, float]) -> None:
    """A topological order as close as possible to the current one (nodes in
    ``priority`` first when ready): inserted buckets may precede their inputs or follow
    a reader, which this puts right."""
    index = _index(graph)
    # placeholders keep their order: it is the program's signature
    rank = {
        n: -2.0 if n.op == "placeholder" else priority.get(n, float(i)) for n, i in index.items()
    }
    missing = {n: len(set(n.all_input_nodes)) for n in graph.nodes}
    ready = [(rank[n], index[n], n) for n in graph.nodes if missing[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            missing[user] -= 1
            if missing[user] == 0:
                heapq.heappush(ready, (rank[user], index[user], user))
    assert len(order) == len(index), "the bucketed graph has a cycle"
    output = order[-1]
    assert output.op == "output"
    for node in order[:-1]:
        output.prepend(node)


def impure_except_collectives(node: fx.Node) -> bool:
    """Dead-code elimination's test: a node stays, though nothing reads its result, when
    it mutates a tensor; not a functional collective, nor a random op."""
    return getattr(node.target, "namespace", None) != "_c10d_functional" and mutates(node)
