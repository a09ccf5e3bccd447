"""Shared launches: moves of an open bucket kind charged a share of one launch
(autoplan.cost.shared_launch); the search that opens them is tested in
tests/unit/planner/test_bucket_search.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import autoplan
from autoplan.core.torch_adapter import Partial, Replicate
from autoplan.cost import shared_launch
from autoplan.cost.buckets import GRAD_SLOT, copies_us
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.compute import ComputeModel
from autoplan.cost.price import price
from autoplan.cost.redistribute import RedistributeModel
from autoplan.cost.shared_launch import SharedLaunch, open_costs
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.tools.runfile import load_topology
from tests.helpers.paths import REPO
from tests.helpers.priced import priced_tiny_llama

# measured by `autoplan calibrate`: a collective's time is affine in its bytes
CALIBRATED = load_topology(str(REPO / "benchmarks" / "cpu-gloo-2x2.yaml"))
DDP = ("tail", "all_reduce", (0,))
# a device whose copies take no time: the launch shares alone
FREE_COPIES = ComputeModel(
    dataclasses.replace(
        CALIBRATED.device, op_overhead_us=0.0, view_overhead_us=0.0, hbm_gbps=1e300
    ),
    (4,),
)


@pytest.fixture(scope="module")
def priced():
    traced, table, _, _ = priced_tiny_llama(2, (4,))
    costs = price(table, traced, CALIBRATED)
    redist = RedistributeModel(table.mesh_shape, CollectiveModel(CALIBRATED))
    return traced, costs, redist


def _pair(e, src, dst) -> tuple[int, int]:
    return e.src_placements.index(src), e.dst_placements.index(dst)


def test_with_no_kind_open_the_table_is_the_same(priced):
    traced, costs, redist = priced
    assert (
        open_costs(costs, SharedLaunch.of(traced, costs, (), 25 * 2**20, FREE_COPIES), redist)
        is costs
    )


def test_ddp_gradients_filling_one_bucket_are_charged_one_launch_in_all(priced):
    """Every gradient's all-reduce charged its share: the shares add up to one launch,
    so the gradients together cost what one all-reduce of all their bytes costs (the
    bucket the step runs); each alone pays less than its own launch. (A move into a
    reshaping node on the way to a gradient is a tail move too.)"""
    traced, costs, redist = priced
    launch = SharedLaunch.of(traced, costs, [DDP], 25 * 2**20, FREE_COPIES)
    opened = open_costs(costs, launch, redist)
    charged, total, alone = 0.0, 0.0, []
    for e, o in zip(costs.edges, opened.edges, strict=True):
        if not launch.where(e):
            assert o.cost is e.cost  # neither a head nor a tail move
        if e.slot != GRAD_SLOT:
            continue
        r, c = _pair(e, (Partial(),), (Replicate(),))
        ((kind, axes, nbytes, us),) = e.route_steps(redist, r, c)
        assert (kind, axes) == ("all_reduce", (0,))
        assert o.cost[r, c] < e.cost[r, c] == pytest.approx(us)
        charged += o.cost[r, c]
        total += nbytes
        alone.append(us)
    assert total < 25 * 2**20 and len(alone) > 20
    p, m = redist.span((0,))
    bucket = redist.collectives.time_us("all_reduce", total, p, m)
    assert charged == pytest.approx(bucket, rel=1e-3)
    assert sum(alone) > 5 * bucket  # a launch per gradient: what the ILP saw before


def test_a_move_of_a_closed_kind_and_moves_without_collectives_keep_their_price(priced):
    traced, costs, redist = priced
    opened = open_costs(
        costs, SharedLaunch.of(traced, costs, [DDP], 25 * 2**20, FREE_COPIES), redist
    )
    for e, o in zip(costs.edges, opened.edges, strict=True):
        if e.slot != GRAD_SLOT:
            continue
        finite = np.isfinite(e.cost)
        assert np.all(o.cost[finite] <= e.cost[finite])
        for r, c in zip(*np.nonzero(finite), strict=True):
            steps = e.route_steps(redist, int(r), int(c))
            if not any((k, a) == ("all_reduce", (0,)) for k, a, _, _ in steps):
                assert o.cost[r, c] == e.cost[r, c], steps


def test_the_charge_is_the_steps_the_read_out_reports(priced):
    """``SharedLaunch.steps`` (what a plan's comm and buckets report) sums to the opened
    table's price of every pair."""
    traced, costs, redist = priced
    launch = SharedLaunch.of(
        traced, costs, [DDP, ("head", "all_gather", (0,))], 25 * 2**20, FREE_COPIES
    )
    opened = open_costs(costs, launch, redist)
    for o in opened.edges:
        if o.tensor is None or not launch.where(o):
            continue
        for r, c in zip(*np.nonzero(np.isfinite(o.cost)), strict=True):
            steps = launch.steps(o, redist, int(r), int(c))
            assert math.isclose(sum(s[3] for s in steps), o.cost[r, c], rel_tol=1e-9, abs_tol=1e-9)


def test_with_the_device_priced_each_member_also_pays_its_part_of_the_copies(priced):
    """Given the compute model, a gradient's charge adds its fill copy and views and its
    share of the flat buffer's allocation: over the one full bucket, the copies
    ``copies_us`` prices for it, so the plan's objective stays its bucketed estimate."""
    traced, costs, redist = priced
    compute = ComputeModel.of(CALIBRATED, (4,))
    plain = open_costs(
        costs, SharedLaunch.of(traced, costs, [DDP], 25 * 2**20, FREE_COPIES), redist
    )
    launch = SharedLaunch.of(traced, costs, [DDP], 25 * 2**20, compute)
    opened = open_costs(costs, launch, redist)
    added, sizes = 0.0, []
    for e, p, o in zip(costs.edges, plain.edges, opened.edges, strict=True):
        if e.slot != GRAD_SLOT:
            continue
        r, c = _pair(e, (Partial(),), (Replicate(),))
        ((_, _, nbytes, _),) = e.route_steps(redist, r, c)
        assert o.cost[r, c] > p.cost[r, c]
        added += o.cost[r, c] - p.cost[r, c]
        sizes.append(nbytes)
    expected = copies_us("tail", "all_reduce", sizes, sizes, compute)
    assert added == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("at_once", [1, 256])
def test_routed_moves_are_charged_the_steps_of_their_routes(monkeypatch, at_once):
    """On edges priced by routes, every cell's opened price is what
    :meth:`SharedLaunch.steps` charges its route, hop after hop: the first collective of
    a head move, every open one of a tail move, including routes of several hops; the
    sources' trees summed one at a time or together."""
    monkeypatch.setattr(shared_launch, "_SOURCES_AT_ONCE", at_once)
    traced, _, _, _ = priced_tiny_llama(1, (2, 2), routes=True)
    table = enumerate_strategies(traced, autoplan.fake_mesh((2, 2), ("dp", "tp")))
    costs = price(table, traced, CALIBRATED, routes=True)
    redist = RedistributeModel(table.mesh_shape, CollectiveModel(CALIBRATED))
    kinds = [
        (where, kind, axes)
        for where in ("head", "tail")
        for kind in ("all_gather", "all_reduce", "reduce_scatter")
        for axes in ((0,), (1,), (0, 1))
    ]
    launch = SharedLaunch.of(traced, costs, kinds, 2**16, FREE_COPIES)
    opened = open_costs(costs, launch, redist)
    saved_on_long_routes = 0
    for e, o in zip(costs.edges, opened.edges, strict=True):
        if e.net is None or e.tensor is None or not launch.where(e):
            continue
        for r, c in zip(*np.nonzero(np.isfinite(e.cost)), strict=True):
            steps = launch.steps(e, redist, int(r), int(c))
            assert math.isclose(sum(s[3] for s in steps), o.cost[r, c], rel_tol=1e-9, abs_tol=1e-9)
            hops = len(e.route(int(r), int(c))) - 1
            saved_on_long_routes += hops > 1 and o.cost[r, c] < e.cost[r, c]
    assert saved_on_long_routes > 0
