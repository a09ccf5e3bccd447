"""Stage 3, strategies: candidate strategies for every node of a traced graph.

Input: a :class:`~autoplan.trace.capture.TracedGraph` and a ``DeviceMesh``. Output: a
:class:`~autoplan.strategies.table.StrategyTable`.

Where rules come from, in order:

1. ``aten.einsum`` (from the einsum rewrite): DTensor's single-dim einsum generator.
2. Ops with DTensor single-dim rules (pointwise, the mm family, embedding, the
   CPU attention kernels via the adapter): the per-axis rules are filled with
   ``Shard(d)`` and with ``_StridedShard(d, sf)`` for every split factor seen on
   the candidate placements of the node's inputs, then expanded to the mesh as
   the cartesian product over axes.
3. Ops with only a full-mesh DTensor strategy function (views, reductions,
   cat/stack): see :mod:`autoplan.strategies.full_mesh`.
4. An op with no tensor input (``arange``): replicated, its value the same on every rank.
5. Anything else: full replication, named once in a warning.

Only ``Partial("sum")`` (and the embedding's masked partial) is kept: other
partial reductions (avg, max, min) multiply the candidates without helping a
training step. Strategies that would shard a dim unevenly are dropped: the
plans autoplan prices and executes use even shards only.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

from autoplan.core.graph import (
    arg_int,
    arg_node,
    arg_str,
    map_args,
    node_op,
    static_args,
    tensor_args,
)
from autoplan.core.placements import Placements, even_placements, is_strided
from autoplan.core.torch_adapter import (
    DeviceMesh,
    OpOverload,
    Placement,
    einsum_rules,
    has_op_strategy,
    single_dim_rules,
    tensor_meta,
)
from autoplan.strategies.expand import even_only, expand, replicate_all
from autoplan.strategies.full_mesh import full_mesh_strategies
from autoplan.strategies.ops import FREE_OPS, MM_FAMILY, has_strided, strided_after_shard
from autoplan.strategies.table import (
    InputRef,
    NodeStrategies,
    Strategy,
    StrategyTable,
    TensorInfo,
)
from autoplan.trace.capture import TracedGraph

aten = torch.ops.aten


class _Enumerator:
    """Walks the graph once; owns the per-run lookups."""

    def __init__(
        self, traced: TracedGraph, mesh: DeviceMesh, strided: bool, use_cache: bool = True
    ) -> None:
        self.traced = traced
        self.use_cache = use_cache
        self.strided = strided
        self.mesh = mesh
        self.mesh_shape = tuple(mesh.shape)
        self.nodes: dict[str, NodeStrategies] = {}
        # per node: (id of its distinct output placements, those placements); twins share
        # their strategy tuple, so the placements are hashed once per distinct tuple
        self.candidates: dict[str, tuple[int, list[Placements]]] = {}
        self._by_strategies: dict[int, tuple[int, list[Placements]]] = {}
        self._interned: dict[tuple[Placements, ...], int] = {}
        self.masked: dict[tuple[Any, ...], Placement] = {}
        self.cache: dict[tuple[Any, ...], tuple[tuple[Strategy, ...], bool]] = {}
        # per signature (op, non-tensor arguments, tensor infos): its single-dim rules,
        # their checked expansion per set of split factors seen, and a full-mesh
        # function's checked answer per input candidate
        self._rules: dict[tuple[Any, ...], list[list[Any]] | None] = {}
        self._by_rules: dict[tuple[Any, ...], list[Strategy]] = {}
        self._by_candidate: dict[tuple[Any, ...], dict[Placements, list[Strategy]]] = {}
        self.fallback: dict[str, None] = {}
        self._infos: dict[fx.Node, TensorInfo | None] = {}  # first output's, per node
        self._tensor_infos: dict[tuple[Any, ...], TensorInfo | None] = {}
        self._placeholders: dict[tuple[int, ...], tuple[Strategy, ...]] = {}
        self.kinds = {n: "param" for n in traced.params}
        self.kinds |= {n: "buffer" for n in traced.buffers}
        self.kinds |= {n: "input" for n in traced.inputs}
        self.kinds |= {n: "tangent" for n in traced.tangents.values()}

    def run(self) -> StrategyTable:
        for node in self.traced.gm.graph.nodes:
            if node.op in ("output",):
                continue
            ns = self._node(node)
            if ns is not None:
                self.nodes[node.name] = ns
        if self.fallback:
            warnings.warn(
                "autoplan: no sharding rule for "
                + ", ".join(self.fallback)
                + "; these ops run replicated",
                stacklevel=3,
            )
        return StrategyTable(
            mesh_shape=self.mesh_shape,
            axis_names=tuple(self.mesh.mesh_dim_names or ()),
            nodes=self.nodes,
            fallback_ops=tuple(self.fallback),
        )

    # -- per node -----------------------------------------------------------------

    def _node(self, node: fx.Node) -> NodeStrategies | None:
        val = node.meta.get("val")
        if node.op == "placeholder":
            info = self._infos[node] = self._tensor_info(val)
            assert info is not None, f"placeholder {node.name} is not a tensor"
            # one shared tuple per shape: the 80 layers' weights ask the same question
            strategies = self._placeholder_strategies(info.shape)
            return NodeStrategies(
                node.name, "placeholder", self.kinds[node.name], (), (), (info,), strategies
            )
        if node.op != "call_function":
            return None
        if node.target is operator.getitem:
            return self._getitem(node)
        if not isinstance(node.target, OpOverload):
            return None
        outs = val if isinstance(val, (tuple, list)) else (val,)
        out_infos = tuple(self._tensor_info(v) for v in outs)
        self._infos[node] = out_infos[0]
        if all(i is None for i in out_infos):
            return None
        in_nodes = tensor_args(node)
        inputs = tuple(InputRef(a.name, 0) for a in in_nodes)
        in_infos = tuple(self._info(a) for a in in_nodes)
        # Identical layers ask identical questions: answer each once per run. Tensor infos
        # are interned (_tensor_info), so they enter the key by identity, not by a hash
        # computed in Python for every node.
        sig = (node.target, static_args(node), tuple(map(id, in_infos)), tuple(map(id, out_infos)))
        key = (sig, tuple(self._candidate_entry(a)[0] for a in in_nodes))
        cached = self.cache.get(key) if self.use_cache else None
        if cached is None:
            found, flag = self._strategies_uncached(node, sig, in_nodes, in_infos, out_infos)
            # one shared tuple per answer: later stages key their caches on it
            cached = self.cache[key] = (tuple(dict.fromkeys(found)), flag)
        strategies, fallback = cached
        if fallback:
            self.fallback[str(node.target)] = None
        return NodeStrategies(
            name=node.name,
            op=str(node.target),
            kind="op",
            inputs=inputs,
            in_tensors=in_infos,
            out_tensors=out_infos,
            strategies=strategies,
            fallback=fallback,
            free=node.target in FREE_OPS,
            pointwise=torch.Tag.pointwise in node.target.tags,
        )

    def _tensor_info(self, val: Any) -> TensorInfo | None:
        """The metadata of a traced value, one object per distinct shape and dtype."""
        if not isinstance(val, torch.Tensor):
            return None
        key = (tuple(int(n) for n in val.shape), val.dtype)
        info = self._tensor_infos.get(key)
        if info is None:
            info = self._tensor_infos[key] = TensorInfo(key[0], val.element_size(), str(val.dtype))
        return info

    def _info(self, node: fx.Node) -> TensorInfo:
        """The tensor metadata of ``node``'s value (a tensor input), read once per node."""
        if node not in self._infos:
            self._infos[node] = self._tensor_info(node.meta["val"])
        info = self._infos[node]
        assert info is not None, f"{node.name} is a tensor input with no tensor meta['val']"
        return info

    def _placeholder_strategies(self, shape: tuple[int, ...]) -> tuple[Strategy, ...]:
        found = self._placeholders.get(shape)
        if found is None:
            found = self._placeholders[shape] = tuple(
                Strategy(outs=(p,), ins=()) for p in even_placements(shape, self.mesh_shape)
            )
        return found

    def _strategies_uncached(
        self,
        node: fx.Node,
        sig: tuple[Any, ...],
        in_nodes: list[fx.Node],
        in_infos: tuple[TensorInfo | None, ...],
        out_infos: tuple[TensorInfo | None, ...],
    ) -> tuple[list[Strategy], bool]:
        """A node's strategies from its signature ``sig`` (op, non-tensor arguments, tensor
        infos) and its inputs' candidates, which matter only as far as the rules read them:
        through the split factors seen (single-dim rules) or one candidate at a time (a
        full-mesh function of one input). Nodes whose candidates differ otherwise share
        the work."""
        memo = self.use_cache
        rules = self._rules.get(sig, _UNKNOWN) if memo else _UNKNOWN
        if rules is _UNKNOWN:
            rules = self._rules_of(node)
            if memo:
                self._rules[sig] = rules
        if rules is not None:
            seen = self._split_seen(in_nodes) if self._strided_ok(node) else frozenset()
            found = self._by_rules.get((sig, seen)) if memo else None
            if found is None:
                width = len(out_infos) + len(in_nodes)
                expanded = expand(rules, seen, len(out_infos), width, self.mesh_shape)
                found = self._checked(node, expanded, in_infos, out_infos)
                if memo:
                    self._by_rules[sig, seen] = found
            strategies, fallback = found, False
        elif has_op_strategy(node_op(node)):
            memos = self._by_candidate.setdefault(sig, {}) if memo else None

            def check(found: list[Strategy]) -> list[Strategy]:
                return self._checked(node, found, in_infos, out_infos)

            strategies = full_mesh_strategies(
                node, self.mesh, self._candidates, len(out_infos), check, memos
            )
            fallback = False
        elif not in_nodes:
            # a factory op (arange, zeros): its value is the same on every rank, replicated
            # for free; no rule is missing
            strategies, fallback = [replicate_all(len(out_infos), 0, self.mesh_shape)], False
        else:
            strategies, fallback = [], True
        if not strategies:
            strategies = [replicate_all(len(out_infos), len(in_nodes), self.mesh_shape)]
            fallback = True
        return strategies, fallback

    def _rules_of(self, node: fx.Node) -> list[list[Any]] | None:
        """The single-dim rules of ``node``'s op (einsum's from its equation), or None."""
        if node.target is aten.einsum.default:
            return einsum_rules(arg_str(node, 0))
        args_meta = map_args(node.args, lambda n: tensor_meta(n.meta["val"]))
        kwargs_meta = map_args(node.kwargs, lambda n: tensor_meta(n.meta["val"]))
        return single_dim_rules(node_op(node), args_meta, kwargs_meta)

    def _checked(
        self,
        node: fx.Node,
        strategies: Iterable[Strategy],
        in_infos: Sequence[TensorInfo | None],
        out_infos: Sequence[TensorInfo | None],
    ) -> list[Strategy]:
        """The even strategies, with _StridedShard only where the op may take it."""
        kept = even_only(strategies, in_infos, out_infos, self.mesh_shape, self.masked)
        if not self._strided_ok(node):
            return [s for s in kept if not has_strided(s)]
        if node.target in FREE_OPS:
            return [s for s in kept if not any(map(strided_after_shard, s.ins))]
        return kept

    def _getitem(self, node: fx.Node) -> NodeStrategies:
        parent, index = arg_node(node, 0), arg_int(node, 1)
        src = self.nodes[parent.name]
        info = src.out_tensors[index]
        assert info is not None, f"{node.name} reads output {index} of {parent.name}: not a tensor"
        seen: dict[Placements, None] = {}
        for s in src.strategies:
            p = s.outs[index]
            if p is not None:
                seen[p] = None
        strategies = tuple(Strategy(outs=(p,), ins=(p,)) for p in seen)
        return NodeStrategies(
            node.name,
            "getitem",
            "op",
            (InputRef(parent.name, index),),
            (info,),
            (info,),
            strategies,
            free=True,
        )

    def _candidates(self, arg: fx.Node) -> list[Placements]:
        return self._candidate_entry(arg)[1]

    def _candidate_entry(self, arg: fx.Node) -> tuple[int, list[Placements]]:
        found = self.candidates.get(arg.name)
        if found is None:
            strategies = self.nodes[arg.name].strategies
            found = self._by_strategies.get(id(strategies))
            if found is None:
                seen: dict[Placements, None] = {}
                for s in strategies:
                    p = s.outs[0]
                    if p is not None:
                        seen[p] = None
                distinct = tuple(seen)
                cid = self._interned.setdefault(distinct, len(self._interned))
                found = self._by_strategies[id(strategies)] = (cid, list(distinct))
            self.candidates[arg.name] = found
        return found

    def _strided_ok(self, node: fx.Node) -> bool:
        """_StridedShard only in native mode, on the views that make it and the mm family."""
        return self.strided and (node.target in FREE_OPS or node.target in MM_FAMILY)

    def _split_seen(self, in_nodes: list[fx.Node]) -> frozenset[Placement]:
        # Split factors seen on the inputs, 1 left out: _S(d,1) is S(d), which every
        # placeholder is filled with anyway (autoplan.core.placements.plain); kept, it would add
        # a second spelling of many of an mm's strategies.
        seen: set[Placement] = set()
        for a in in_nodes:
            for cand in self._candidates(a):
                seen.update(p for p in cand if is_strided(p) and p.split_factor != 1)
        return frozenset(seen)


_UNKNOWN: Any = object()  # a signature whose rules were not looked up yet


def enumerate_strategies(
    traced: TracedGraph, mesh: DeviceMesh, *, mm_mode: str = "einsum", cache: bool = True
) -> StrategyTable:
    """Candidate strategies for every node of ``traced`` on ``mesh``.

    ``_StridedShard`` placements are offered only with ``mm_mode="native"``,
    on views (which produce them when flattening a dim sharded on two axes)
    and on the mm family (which DTensor's single-dim rules expand with the
    split factors seen on their inputs). ``cache=False`` re-derives every
    node's strategies instead of reusing a twin's (for checking the cache).
    """
    return _Enumerator(traced, mesh, strided=mm_mode == "native", use_cache=cache).run()
