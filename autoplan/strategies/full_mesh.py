"""Strategies from DTensor's full-mesh strategy functions (views, reductions, cat/stack).

Input: an aten node, the mesh, and the candidate output placements of each
producer. Output: autoplan :class:`~autoplan.strategies.table.Strategy` objects.

These functions take every input as an ``OpStrategy`` and derive one strategy
per input candidate. Some refuse a candidate outright (a ``_StridedShard`` a
view cannot unflatten), and cat/stack pick a single placement for a whole
list: in both cases the question is asked again one candidate at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from autoplan.core.graph import map_args, node_op, tensor_args
from autoplan.core.placements import Placements
from autoplan.core.torch_adapter import (
    DeviceMesh,
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
    op_strategy,
    schema_info,
    tensor_meta,
)
from autoplan.strategies.table import Strategy

Candidates = Callable[[fx.Node], list[Placements]]
Check = Callable[[list[Strategy]], list[Strategy]]
_EVERY_INPUT = "*"


def full_mesh_strategies(
    node: fx.Node,
    mesh: DeviceMesh,
    candidates: Candidates,
    num_outs: int,
    check: Check,
    memo: dict[Placements, list[Strategy]] | None = None,
) -> list[Strategy]:
    """DTensor's strategies for ``node`` given every candidate placement of its inputs,
    each list passed through ``check`` (which drops the ones the caller cannot use).

    ``memo``, for a node of one tensor input, holds the checked answer per candidate of
    nodes of the same signature: only the candidates it lacks are asked about.
    """
    listed = bool(node.args) and isinstance(node.args[0], (list, tuple))
    ins = tensor_args(node)
    if memo is not None and not listed and len(ins) == 1:
        return _by_candidate(node, mesh, candidates(ins[0]), num_outs, check, memo)
    if not listed:
        try:
            return check(_ask(node, mesh, candidates, num_outs, None))
        except Exception:
            pass
    # cat/stack: every listed tensor pinned to one candidate; otherwise the first input.
    target = _EVERY_INPUT if listed else ins[0].name
    out: list[Strategy] = []
    for cand in candidates(ins[0]):
        try:
            out.extend(_ask(node, mesh, candidates, num_outs, (target, cand)))
        except Exception:
            continue
    if not out and not listed:
        # Some functions (nll_loss_backward) read input k's i-th strategy beside another
        # input's i-th: every input's candidates are cycled to one common length. Each
        # answer still names the input placements it needs, so any pairing is valid.
        longest = max(len(candidates(a)) for a in ins)

        def cycled(n: fx.Node) -> list[Placements]:
            cands = candidates(n)
            return [cands[i % len(cands)] for i in range(longest)]

        try:
            out = _ask(node, mesh, cycled, num_outs, None)
        except Exception:
            out = []
    return check(out)


def _by_candidate(
    node: fx.Node,
    mesh: DeviceMesh,
    cands: list[Placements],
    num_outs: int,
    check: Check,
    memo: dict[Placements, list[Strategy]],
) -> list[Strategy]:
    """The strategies of a one-input node, candidate by candidate through ``memo``.

    DTensor's full-mesh functions answer each input strategy on its own, one output
    strategy each: the new candidates are asked about :data:`_BATCH` at a time and the
    answers read in order, or one at a time when the function refuses one of a batch (a
    view cannot unflatten some ``_StridedShard``) or answers with another count.
    """
    new = [c for c in cands if c not in memo]
    for start in range(0, len(new), _BATCH):
        batch = new[start : start + _BATCH]
        try:
            found: list[Strategy] | None = _ask(node, mesh, _each(batch), num_outs, None)
        except Exception:
            found = None
        if found is not None and len(found) == len(batch):
            for cand, s in zip(batch, found, strict=True):
                memo[cand] = check([s])
        else:
            for cand in batch:
                try:
                    memo[cand] = check(_ask(node, mesh, _only(cand), num_outs, None))
                except Exception:
                    memo[cand] = []
    return [s for cand in cands for s in memo[cand]]


# Candidates asked about in one call: a strategy function lists, per answer, a cost
# against every input candidate it was given, so a call's work grows as its square.
_BATCH = 64


def _only(cand: Placements) -> Candidates:
    """Candidates that offer every input ``cand`` alone."""
    return _each([cand])


def _each(cands: list[Placements]) -> Candidates:
    """Candidates that offer every input ``cands``."""
    return lambda _: cands


def _ask(
    node: fx.Node,
    mesh: DeviceMesh,
    candidates: Candidates,
    num_outs: int,
    pin: tuple[str, Placements] | None,
) -> list[Strategy]:
    def to_strategy(n: fx.Node) -> OpStrategy:
        meta = tensor_meta(n.meta["val"])
        if pin is not None and pin[0] in (n.name, _EVERY_INPUT):
            cands = [pin[1]]
        else:
            cands = candidates(n)
        return OpStrategy([OpSpec(DTensorSpec(mesh, p, tensor_meta=meta)) for p in cands])

    args = tuple(_tuple_strategy(a) for a in map_args(node.args, to_strategy))
    kwargs = {k: _tuple_strategy(v) for k, v in map_args(node.kwargs, to_strategy).items()}
    op = node_op(node)
    schema = OpSchema(op, args, kwargs, schema_info=schema_info(op))
    result = op_strategy(op, schema)
    if isinstance(result, TupleStrategy):
        return _zip_tuple_strategy(result, num_outs)
    return [_from_spec(s, num_outs) for s in result.strategies]


def _tuple_strategy(arg: Any) -> Any:
    """A list of tensors becomes a TupleStrategy, as DTensor's dispatcher wraps it."""
    if isinstance(arg, (list, tuple)) and arg and all(isinstance(x, OpStrategy) for x in arg):
        return TupleStrategy(tuple(arg))
    return arg


def _from_spec(spec: OpSpec, num_outs: int) -> Strategy:
    out_specs = spec.output_specs
    if isinstance(out_specs, DTensorSpec):
        outs: tuple[Placements | None, ...] = (tuple(out_specs.placements),)
    else:
        assert out_specs is not None, "a strategy function gives each output spec"
        outs = tuple(None if o is None else tuple(o.placements) for o in out_specs)
    if num_outs > len(outs):
        outs = outs + (outs[0],) * (num_outs - len(outs))
    ins_specs = spec.input_specs
    if ins_specs is not None:
        ins = tuple(tuple(s.placements) for s in ins_specs)
    else:  # a spec without input specs asks for its inputs placed as its output
        first = outs[0]
        assert first is not None, "a spec without input specs has its first output"
        ins = (first,)
    return Strategy(outs=outs, ins=ins)


def _zip_tuple_strategy(result: TupleStrategy, num_outs: int) -> list[Strategy]:
    children = [c for c in result.children if isinstance(c, OpStrategy)]
    lengths = {len(c.strategies) for c in children}
    if len(children) != num_outs or len(lengths) != 1:
        return []
    out = []
    for specs in zip(*(c.strategies for c in children), strict=True):
        outs = tuple(tuple(s.output_spec.placements) for s in specs)
        ins = tuple(tuple(x.placements) for x in specs[0].input_specs or ())
        out.append(Strategy(outs=outs, ins=ins))
    return out
