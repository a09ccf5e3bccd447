"""Whole-edge pricing (EdgePricer) equals pair-by-pair pricing, bit for bit.

Two references: ``RedistributeModel.cost_us`` (today's per-pair path, which shares the
walk on codes), and ``_Oracle``, the per-pair walk on DTensor placement objects as
autoplan had it before codes and edge matrices (commit c0fe833), kept here frozen so
that a change to the shared walk cannot hide from these tests; its one later addition,
``_strided_runs``, is written on placement objects too.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

import autoplan
from autoplan.core.placements import fmt, plain, shard_degrees, sharded_dim
from autoplan.core.topology import Topology, group_span
from autoplan.core.torch_adapter import Partial, Replicate, Shard, _StridedShard
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.edge_prices import EdgePricer
from autoplan.cost.price import price
from autoplan.cost.redistribute import RedistributeModel
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint


def _step(src, dst):
    if src == dst:
        return ""
    s_dim, d_dim = sharded_dim(src), sharded_dim(dst)
    strided = isinstance(src, _StridedShard) or isinstance(dst, _StridedShard)
    if isinstance(src, Partial):
        if isinstance(dst, Replicate):
            return "all_reduce"
        if d_dim is None:
            return None
        return "all_reduce" if strided else "reduce_scatter"  # DTensor's strided path
    if s_dim is not None:
        if isinstance(dst, Replicate):
            return "all_gather"
        if d_dim is not None:
            return "all_gather" if s_dim == d_dim or strided else "all_to_all"
        return None
    return ""


def _transforms(src, dst):
    current, steps = list(src), []
    if any(sharded_dim(p) is not None for p in src):
        for axis in reversed(range(len(src))):
            target, d = dst[axis], sharded_dim(dst[axis])
            if d is not None:
                have = [i for i in range(axis) if sharded_dim(current[i]) == d]
                want = [i for i in range(axis) if sharded_dim(dst[i]) == d]
                if have != want:
                    target = Replicate()
            if current[axis] != target:
                steps.append((axis, current[axis], target))
                current[axis] = target
    for axis, target in enumerate(dst):
        if current[axis] != target:
            steps.append((axis, current[axis], target))
            current[axis] = target
    return steps


def _strided_runs(src, dst) -> bool:
    """A move with a ``_StridedShard`` side changes one axis, and where a dim is sharded
    on several axes with a stride among them, only its last such axis, strided alone."""
    if not any(isinstance(p, _StridedShard) for p in (*src, *dst)):
        return True
    changed = {a for a, (p, q) in enumerate(zip(src, dst, strict=True)) if p != q}
    if len(changed) > 1:
        return False
    for side in (src, dst):
        by_dim: dict[int, list[int]] = {}
        for a, p in enumerate(side):
            if sharded_dim(p) is not None:
                by_dim.setdefault(sharded_dim(p), []).append(a)
        for axes in by_dim.values():
            strided = [a for a in axes if isinstance(side[a], _StridedShard)]
            if len(axes) > 1 and strided and (strided != [axes[-1]] or changed != {axes[-1]}):
                return False
    return True


def _fuse(steps, shape, mesh_shape):
    out, i = [], 0
    while i < len(steps):
        _, a, b = steps[i]
        kind, j = _step(a, b) or "", i + 1
        if kind in ("all_gather", "all_reduce", "reduce_scatter"):
            while j < len(steps) and steps[j][1:] == (a, b):
                j += 1
        run = steps[i:j]
        axes = [s[0] for s in run]
        order = axes if kind == "all_reduce" else sorted(axes, reverse=kind == "all_gather")
        contiguous = sorted(axes) == list(range(min(axes), max(axes) + 1))
        even = kind != "reduce_scatter" or (
            shape[sharded_dim(b)] % math.prod(mesh_shape[x] for x in axes) == 0
        )
        if len(run) > 1 and axes == order and contiguous and even:
            out.append((kind, tuple(sorted(axes)), b))
        else:
            out.extend((_step(x, y) or "", (ax,), y) for ax, x, y in run)
        i = j
    return out


class _Oracle:
    """The pre-EdgePricer per-pair price: walk and sum on placement objects (an _S(d,1)
    read as the S(d) it is)."""

    def __init__(self, mesh_shape):
        self.mesh_shape = tuple(mesh_shape)
        self.collectives = CollectiveModel(Topology())

    def cost_us(self, src, dst, shape, dtype_bytes) -> float:
        src, dst = plain(src), plain(dst)
        if src == dst:
            return 0.0
        if not _strided_runs(src, dst):
            return math.inf
        if any(_step(s, d) is None for s, d in zip(src, dst, strict=True)):
            return math.inf
        current, mesh = list(src), self.mesh_shape
        numel = math.prod(shape) * dtype_bytes
        times = []
        for kind, axes, target in _fuse(_transforms(src, dst), shape, mesh):
            local = numel / math.prod(shard_degrees(current, mesh, len(shape)))
            gathered = [Replicate() if a in axes else p for a, p in enumerate(current)]
            for a in axes:
                current[a] = target
            if not kind:
                continue
            nbytes = (
                numel / math.prod(shard_degrees(gathered, mesh, len(shape)))
                if kind == "all_gather"
                else local
            )
            p, m = group_span(mesh, axes, self.collectives.topology.gpus_per_node)
            times.append(self.collectives.time_us(kind, nbytes, p, m))
        return sum(times)


def _check_pairs(fast, rows, cols, shape, dtype_bytes, refs, pairs, what) -> None:
    for r, c in pairs:
        for ref in refs:
            want = ref.cost_us(rows[r], cols[c], shape, dtype_bytes)
            # Bitwise, inf where inf: the sums run step after step in cost_us's order.
            assert fast[r, c] == want, f"{what}: {fmt(rows[r])} -> {fmt(cols[c])}"


@pytest.mark.parametrize(
    "mm_mode, mesh_shape",
    [
        ("einsum", (2, 2)),
        ("native", (2, 2)),
        ("einsum", (2, 2, 2)),
        pytest.param("native", (2, 2, 2), marks=pytest.mark.slow),
    ],
)
def test_every_edge_of_a_tiny_llama_equals_pair_by_pair_prices(mm_mode, mesh_shape):
    """price()'s edge matrices on a tiny LLaMA equal cost_us and the frozen oracle, on every
    edge (a seeded sample of pairs per edge: 2x2x2 edges reach 10^5 pairs)."""
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced, _ = rewrite(trace_joint(model, lambda: torch.randint(0, 128, (4, 16))), mm_mode=mm_mode)
    mesh = autoplan.fake_mesh(mesh_shape, ("dp", "tp", "cp")[: len(mesh_shape)])
    table = enumerate_strategies(traced, mesh, mm_mode=mm_mode)
    costs = price(table, traced, Topology(), reduce_bytes=4)
    refs = (RedistributeModel(mesh_shape, CollectiveModel(Topology())), _Oracle(mesh_shape))
    rng = random.Random(0)
    strided = impossible = 0
    distinct = {id(e.cost): e for e in costs.edges}  # twin edges share one matrix
    for e in distinct.values():
        assert e.tensor is not None
        rows, cols = e.src_placements, e.dst_placements
        strided += any(isinstance(p, _StridedShard) for p in itertools.chain(*rows, *cols))
        impossible += int(np.isinf(e.cost).sum())
        pairs = list(itertools.product(range(len(rows)), range(len(cols))))
        sample = pairs if len(pairs) <= 64 else rng.sample(pairs, 64)
        what = f"{e.src} -> {e.dst} slot {e.slot}"
        _check_pairs(e.cost, rows, cols, e.tensor.shape, e.tensor.dtype_bytes, refs, sample, what)
    assert impossible, "some moves (S -> P) should be impossible"
    assert strided or mm_mode == "einsum", "native mode should offer _StridedShard placements"


def test_one_pricer_across_shapes_forms_and_partial_kinds():
    """One pricer reused across shapes that do and do not divide by the flattened groups
    (which decides whether PP -> S(0)S(0) is one reduce-scatter), strided shards of two split
    factors and two Partial kinds equals both references on every pair."""
    axis = [
        Replicate(),
        Partial(),
        Partial("avg"),
        Shard(0),
        Shard(1),
        _StridedShard(0, split_factor=2),
        _StridedShard(0, split_factor=4),
    ]
    for mesh_shape in [(2, 2), (2, 4), (2, 2, 2)]:
        pricer = EdgePricer(RedistributeModel(mesh_shape, CollectiveModel(Topology())))
        refs = (RedistributeModel(mesh_shape, CollectiveModel(Topology())), _Oracle(mesh_shape))
        placements = list(itertools.product(axis, repeat=len(mesh_shape)))
        rows, cols = placements[::5], placements[1::4]
        pairs = list(itertools.product(range(len(rows)), range(len(cols))))
        for shape, dtype_bytes in [((16, 8), 2), ((6, 12), 2), ((8, 6), 4), ((1024, 4096), 2)]:
            fast = pricer.matrix(rows, cols, shape, dtype_bytes)
            _check_pairs(fast, rows, cols, shape, dtype_bytes, refs, pairs, f"{mesh_shape} {shape}")
        assert np.isinf(fast).any() and (fast == 0).any() and (fast > 0).any()


def test_unfused_reduce_scatter_when_the_dim_does_not_divide():
    """PP -> S(0)S(0) on 2x2 is one reduce-scatter when dim 0 divides by 4 and two when it
    does not, and a pricer asked about both shapes keeps them apart."""
    redist = RedistributeModel((2, 2), CollectiveModel(Topology()))
    pricer = EdgePricer(redist)
    p, s0 = Partial(), Shard(0)
    for shape, count in [((8, 4), 1), ((6, 4), 2), ((8, 4), 1)]:
        found = redist.steps((p, p), (s0, s0), shape, 2)
        assert found is not None and len(found) == count, shape
        want = _Oracle((2, 2)).cost_us((p, p), (s0, s0), shape, 2)
        assert pricer.matrix([(p, p)], [(s0, s0)], shape, 2)[0, 0] == want


def test_moves_on_different_dims_share_a_walk_only_where_the_dims_divide_alike():
    """PP -> S(0)S(0) and PP -> S(1)S(1) on 2x2 fuse into one reduce-scatter only when their
    own dim divides by 4: one pricer asked about (6, 8) and then (8, 6) prices each as the
    oracle does, and S(0)S(1) -> S(1)S(0) costs what S(1)S(0) -> S(0)S(1) does (one walk)."""
    mesh = (2, 2)
    pricer = EdgePricer(RedistributeModel(mesh, CollectiveModel(Topology())))
    oracle = _Oracle(mesh)
    p, s0, s1 = Partial(), Shard(0), Shard(1)
    cols = [(s0, s0), (s1, s1)]
    for shape in [(6, 8), (8, 6), (6, 8)]:
        got = pricer.matrix([(p, p)], cols, shape, 2)[0]
        want = [oracle.cost_us((p, p), c, shape, 2) for c in cols]
        assert got.tolist() == want, shape
    swap = pricer.matrix([(s0, s1), (s1, s0)], [(s1, s0), (s0, s1)], (8, 8), 2)
    assert swap[0, 0] == swap[1, 1] > 0
    assert swap[0, 0] == oracle.cost_us((s0, s1), (s1, s0), (8, 8), 2)


def test_equal_placement_tuples_get_one_int_whatever_the_object():
    """The pricer's ints follow equality, not identity: a fresh tuple equal to one seen
    before gets its int, an unequal one a new int."""
    pricer = EdgePricer(RedistributeModel((2, 2), CollectiveModel(Topology())))
    a, c = (Shard(0), Replicate()), (Replicate(), Shard(0))
    b = (Shard(0), Replicate())
    assert b is not a
    assert pricer.ids([a, c, b, a]) == (0, 1, 0, 0)
    assert pricer.ids([(Replicate(), Shard(0)), (Partial(), Partial())]) == (1, 2)


def test_split_factor_one_gets_the_int_and_prices_of_its_shard_spelling():
    """_S(d,1) is S(d): one int, a free move between the spellings, and every price to
    other placements equal to the S(d) spelling's, in both pricers."""
    model = RedistributeModel((2, 2), CollectiveModel(Topology()))
    pricer = EdgePricer(model)
    one = (Shard(0), _StridedShard(0, split_factor=1))
    spelt = (Shard(0), Shard(0))
    others = [(Replicate(), Replicate()), (Shard(1), Replicate()), (Partial(), Shard(0))]
    assert pricer.ids([one])[0] == pricer.ids([spelt])[0]
    assert model.cost_us(one, spelt, (8, 8), 4) == 0.0
    fast = pricer.matrix([one, spelt], others + [one, spelt], (8, 8), 4)
    assert np.array_equal(fast[0], fast[1]) and (fast[:, -2:] == 0).all()
    assert (fast[:, :3] > 0).all()
    for q in others:
        assert model.cost_us(one, q, (8, 8), 4) == model.cost_us(spelt, q, (8, 8), 4)
        assert model.cost_us(q, one, (8, 8), 4) == model.cost_us(q, spelt, (8, 8), 4)


def test_codes_made_in_numpy_are_the_codes_made_pair_by_pair():
    """Random placement tuples on 2x2x2 (S, _S, P, R), two shapes: the numpy forms pick _pair's move for every pair."""
    rng = random.Random(0)
    pricer = EdgePricer(RedistributeModel((2, 2, 2), CollectiveModel(Topology())))
    one = (
        Replicate(), Partial(), Partial("avg"), Shard(0), Shard(1), Shard(2),
        _StridedShard(0, split_factor=2), _StridedShard(1, split_factor=4),
    )  # fmt: skip
    tuples = [tuple(rng.choice(one) for _ in range(3)) for _ in range(60)]
    ids = pricer.ids(tuples)
    src = np.repeat(np.array(ids), len(ids))
    dst = np.tile(np.array(ids), len(ids))
    for div, shape in enumerate(((8, 4, 6), (6, 8, 4))):  # dim 0 divides by 4, then not
        pricer.matrix_of_ids((ids[0],), (ids[0],), shape, 4)  # interns its divisibility
        # as _layout asks: the divisibility where two P source axes may fuse, else -1
        at = np.where([pricer._reduces[a] for a in src.tolist()], div, -1)
        got = pricer._moves_of(src, dst, at, shape)
        pairs = zip(src.tolist(), dst.tolist(), at.tolist(), strict=True)
        want = [pricer._move_id(pricer._pair(a, b, shape)) for a, b, _ in pairs]
        assert got.tolist() == want


def test_packed_grid_forms_pick_the_move_of_every_pair():
    """Random placement tuples on 2x2x2 (S, _S, P, R): _grid's packed forms, made for the
    whole grid at once, pick _pair's move for every pair whose row cannot fuse a
    reduce-scatter, on two pricers that meet the tuples in different orders."""
    rng = random.Random(1)
    one = (
        Replicate(), Partial(), Partial("avg"), Shard(0), Shard(1), Shard(2),
        _StridedShard(0, split_factor=2), _StridedShard(1, split_factor=4),
    )  # fmt: skip
    tuples = [tuple(rng.choice(one) for _ in range(3)) for _ in range(80)]
    for order in (tuples, tuples[::-1]):
        pricer = EdgePricer(RedistributeModel((2, 2, 2), CollectiveModel(Topology())))
        ids = np.array(pricer.ids(order))
        rows = ids[[not pricer._reduces[i] for i in ids.tolist()]]
        got = pricer._grid(rows, ids, (8, 4, 6))
        assert got.shape == (len(rows), len(ids)) and len(rows) > 40
        want = [[pricer._move_id(pricer._pair(a, b, (8, 4, 6))) for b in ids] for a in rows]
        assert got.tolist() == want
