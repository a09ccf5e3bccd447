"""The redistribution cost model runs the collectives DTensor runs, checked by execution.

For every pair of placements of a small tensor on a 2x2 mesh (and a sample on 2x2x2),
DTensor redistributes it under ``LocalTensorMode`` (one process simulating every rank,
with the flattened meshes ``apply`` creates), ``CommDebugMode`` counts the collectives,
and the count per kind must equal the steps :class:`RedistributeModel` prices. A
transition the model calls impossible is one DTensor refuses, runs wrong (strided moves,
``_strided_ok``) or autoplan never offers. Values are checked shard by shard.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
import torch
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import autoplan
from autoplan.core.placements import Placements, fmt, made_by_op_only, parse
from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import (
    LocalTensorMode,
    Partial,
    Replicate,
    Shard,
    _StridedShard,
    redistribute,
)
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.redistribute import RedistributeModel
from autoplan.runtime.execute import collective_counts, flatten_mesh_groups, move
from tests.helpers.execution import placed

CHOICES = (Replicate(), Partial(), Shard(0), Shard(1))
SHAPE = (8, 8)


def _check(mesh, model: RedistributeModel, src, dst, run=redistribute, shape=SHAPE) -> str | None:
    """None when the move is priced impossible, or when ``run`` makes it with the priced
    collectives and leaves every rank the shard ``distribute_tensor`` gives it (the
    full tensor for a Partial target): a full tensor alone would not do, DTensor
    gathers ``_S(0,1)_S(0,2)`` to another tensor than the one it holds."""
    steps = model.steps(src, dst, shape, 4)
    if steps is None:
        return None
    x = torch.arange(float(math.prod(shape))).reshape(shape)
    with CommDebugMode() as comm:
        out = run(placed(x, mesh, src), mesh, dst)
    executed = collective_counts(comm.get_comm_counts())
    priced = dict(Counter(kind for kind, *_ in steps))
    if executed != priced:
        return f"{fmt(src)} -> {fmt(dst)}: ran {executed}, priced {priced}"
    if any(isinstance(p, Partial) for p in dst):
        right = torch.equal(out.full_tensor(), x)
    else:
        want = distribute_tensor(x, mesh, list(dst), src_data_rank=None).to_local()
        got = out.to_local()
        right = all(torch.equal(t, want._local_tensors[r]) for r, t in got._local_tensors.items())
    return None if right else f"{fmt(src)} -> {fmt(dst)}: wrong shards"


def _model(mesh_shape) -> RedistributeModel:
    return RedistributeModel(mesh_shape, CollectiveModel(Topology()))


@pytest.mark.parametrize(
    "mesh_shape, names, sample",
    [((2, 2), ("a", "b"), None), ((2, 2, 2), ("a", "b", "c"), 300)],
)
def test_priced_collectives_are_the_ones_dtensor_runs(mesh_shape, names, sample):
    mesh = autoplan.fake_mesh(mesh_shape, names)
    model = _model(mesh_shape)
    pairs = list(itertools.product(itertools.product(CHOICES, repeat=len(mesh_shape)), repeat=2))
    if sample is not None:
        pairs = random.Random(0).sample(pairs, sample)
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        bad = [msg for src, dst in pairs if (msg := _check(mesh, model, src, dst))]
    assert not bad, f"{len(bad)} of {len(pairs)} transitions differ, e.g. {bad[:5]}"


def test_nested_shard_needs_a_gather_and_fused_steps_are_one_collective():
    """RS(0) -> S(0)S(0) is no local slice (the local pieces differ); PP -> S(0)S(0) and
    S(0)S(0) -> RR are one collective each over the flattened group."""
    model = _model((2, 2))
    kinds = lambda s, d: [(k, axes) for k, axes, *_ in model.steps(s, d, SHAPE, 4)]  # noqa: E731
    r, p, s0 = Replicate(), Partial(), Shard(0)
    assert kinds((r, s0), (s0, s0)) == [("all_gather", (1,))]
    assert kinds((p, p), (s0, s0)) == [("reduce_scatter", (0, 1))]
    assert kinds((s0, s0), (r, r)) == [("all_gather", (0, 1))]
    assert kinds((r, r), (s0, s0)) == []


def test_split_factor_one_moves_as_shard_and_relabels_for_free():
    """Moves on 2x2 with an _S(d,1) on either side (260 of the 1 040), run by execute.move:
    the priced collectives (its S(d) spelling's; none between spellings), the right values."""
    mesh = autoplan.fake_mesh((2, 2), ("a", "b"))
    model = _model((2, 2))
    choices = (*CHOICES, _StridedShard(0, split_factor=1), _StridedShard(1, split_factor=1))
    pairs = [
        (src, dst)
        for src, dst in itertools.product(itertools.product(choices, repeat=2), repeat=2)
        if any(isinstance(p, _StridedShard) for p in (*src, *dst))
    ]
    assert len(pairs) == 1040
    pairs = random.Random(0).sample(pairs, 260)
    strided, plain = (Shard(0), _StridedShard(0, split_factor=1)), (Shard(0), Shard(0))
    assert model.steps(strided, plain, SHAPE, 4) == []
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        bad = [msg for src, dst in pairs if (msg := _check(mesh, model, src, dst, move))]
    assert not bad, f"{len(bad)} of {len(pairs)} transitions differ, e.g. {bad[:5]}"


def test_a_placement_only_its_op_makes_passes_through_when_the_value_has_it():
    """A planned placement only its op makes (P(avg)) is accepted as is when the value
    carries it, and refused with the node's name when it does not."""
    from autoplan.runtime.execute import PlannedGraph

    mesh = autoplan.fake_mesh((2, 2), ("a", "b"))
    graph = PlannedGraph.__new__(PlannedGraph)
    graph.mesh = mesh
    want = parse("P(avg)P(avg)", 2)
    with LocalTensorMode(mesh.size()):
        x = torch.arange(64.0).reshape(SHAPE)
        avg = placed(x, mesh, (Partial("avg"), Partial("avg")))
        assert graph._place(avg, want, "mean") is avg
        with pytest.raises(RuntimeError, match="mean: the plan wants P\\(avg\\)P\\(avg\\)"):
            graph._place(placed(x, mesh, (Replicate(), Replicate())), want, "mean")


def test_a_route_through_a_mean_partial_runs_from_the_plan_text():
    """The 8B plan's route P(avg)P(avg) -> P(avg)S(1) -> S(0)S(1), read from its text by
    the plan's codec, runs hop by hop to the full tensor's shards (the P(avg) the node
    holds is one only its op makes)."""
    from autoplan.result.records import CODEC, NodePlacement, Slot
    from autoplan.runtime.execute import PlannedGraph

    mesh = autoplan.fake_mesh((2, 2), ("a", "b"))
    graph = PlannedGraph.__new__(PlannedGraph)
    graph.mesh = mesh
    node = CODEC.decode(
        {"op": "aten.add.Tensor", "out": ["S(0)S(1)"], "in": ["S(0)S(1)"]}, NodePlacement
    )
    routes = CODEC.decode({"add:0": ["P(avg)S(1)"]}, dict[Slot, tuple[Placements, ...]])
    assert made_by_op_only(CODEC.decode("P(avg)P(avg)", Placements))
    (hop,), want = routes[("add", 0)], node.inputs[0]  # as execute reads them
    assert hop == (Partial("avg"), Shard(1)) and want == (Shard(0), Shard(1))
    with LocalTensorMode(mesh.size()):
        x = torch.arange(64.0).reshape(SHAPE)
        avg = placed(x, mesh, (Partial("avg"), Partial("avg")))
        out = graph._place(avg, want, "add input mean", via=[hop])
        assert tuple(out.placements) == want
        assert torch.equal(out.full_tensor(), x)


@pytest.mark.parametrize("shape", [(8, 8), (6, 10)])
def test_every_strided_move_priced_possible_runs_as_priced(shape):
    """On 2x2 the 59 strided moves priced possible run as priced, at even and uneven shapes."""
    # possible: one axis changing and, in S(0)_S(0,2), only the strided one (_strided_ok)
    mesh = autoplan.fake_mesh((2, 2), ("a", "b"))
    model = _model((2, 2))
    s0, r, p = Shard(0), Replicate(), Partial()
    strided = _StridedShard(0, split_factor=2)
    pairs = [
        (src, dst)
        for src, dst in itertools.product(
            itertools.product((*CHOICES, strided), repeat=2), repeat=2
        )
        if src != dst and strided in (*src, *dst) and model.steps(src, dst, shape, 4) is not None
    ]
    assert len(pairs) == 59
    assert model.steps((s0, strided), (s0, r), shape, 4) is not None  # gather the stride
    for wrong in [((strided, r), (r, s0)), ((r, strided), (s0, strided)), ((p, s0), (strided, s0))]:
        assert model.steps(*wrong, shape, 4) is None, wrong  # other shards, raise, other comm
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        bad = [msg for src, dst in pairs if (msg := _check(mesh, model, src, dst, move, shape))]
    assert not bad, f"{len(bad)} of {len(pairs)} transitions differ, e.g. {bad[:5]}"


def test_strided_moves_priced_possible_on_2x2x2_run_as_priced():
    """On 2x2x2 (_S(0,2), _S(0,4)) a sample of 772 strided moves priced possible runs as priced."""
    mesh = autoplan.fake_mesh((2, 2, 2), ("a", "b", "c"))
    model = _model((2, 2, 2))
    strided = (_StridedShard(0, split_factor=2), _StridedShard(0, split_factor=4))
    tuples = list(itertools.product((*CHOICES, *strided), repeat=3))
    pairs = [
        (src, dst)
        for src, dst in itertools.product(tuples, repeat=2)
        if src != dst
        and any(p in strided for p in (*src, *dst))
        and model.steps(src, dst, (16, 16), 4) is not None
    ]
    assert len(pairs) == 772
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        sample = random.Random(0).sample(pairs, 120)
        bad = [msg for src, dst in sample if (msg := _check(mesh, model, src, dst, move, (16, 16)))]
    assert not bad, f"{len(bad)} of {len(sample)} transitions differ, e.g. {bad[:5]}"
