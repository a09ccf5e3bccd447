"""The compute model's terms beyond the roofline: a view's dispatch, the attention
kernels' share of the peak, the ranks' drift (autoplan.cost.compute)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
import torch

import autoplan
from autoplan.core.measured import CollectiveFits, LinkFit
from autoplan.core.topology import Device, Topology
from autoplan.cost.compute import ATTENTION_OPS
from autoplan.cost.price import price
from autoplan.models.llama3 import Transformer, tiny
from autoplan.rewrite import rewrite
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import trace_joint

# flop-bound: the bandwidth is so high that no op's bytes set its time
BASE = Device("synthetic", 0.2, 0.08, 1e9, 16.0, 1.0, 1.0, 2.0)


@cache
def _problem():
    mesh = autoplan.fake_mesh((2,), ("dp",))
    with torch.device("meta"):
        model = Transformer(tiny(1))
    traced, _ = rewrite(
        trace_joint(model, lambda: torch.randint(0, 128, (8, 32))), mm_mode="einsum"
    )
    return traced, enumerate_strategies(traced, mesh)


def _compute(**changes) -> dict[str, np.ndarray]:
    traced, table = _problem()
    skew = changes.pop("skew", 0.0)
    fits = CollectiveFits(intra=(("all_reduce", LinkFit(10.0, 1.0, 1.0)),), skew=skew)
    topo = Topology(device=dataclasses.replace(BASE, **changes), collectives=fits)
    return price(table, traced, topo).compute


def test_a_view_costs_its_dispatch_and_nothing_else_changes():
    """view_overhead_us prices every view node, whatever its strategy; no other node moves."""
    _, table = _problem()
    base, views = _compute(), _compute(view_overhead_us=3.0)
    free = {n for n, ns in table.nodes.items() if ns.kind == "op" and ns.free}
    assert free
    for name in base:
        if name in free:
            assert np.all(base[name] == 0.0) and np.all(views[name] == 3.0), name
        else:
            assert np.array_equal(base[name], views[name]), name


def test_attention_runs_at_its_share_of_the_peak():
    """attention_efficiency 0.5 doubles a flop-bound attention kernel's time beyond its
    overhead, forward and backward; every other op keeps its price."""
    traced, _ = _problem()
    attention = {n.name for n in traced.gm.graph.nodes if n.target in ATTENTION_OPS}
    assert len(attention) == 2  # the forward and the backward kernel
    base, half = _compute(), _compute(attention_efficiency=0.5)
    for name in base:
        if name in attention:
            assert half[name] - 2.0 == pytest.approx(2 * (base[name] - 2.0)), name
        else:
            assert np.array_equal(base[name], half[name]), name


def test_the_ranks_drift_scales_every_ops_time():
    """collectives.skew 0.2 prices every op 1.2 times its time, views included."""
    base, drift = _compute(view_overhead_us=3.0), _compute(view_overhead_us=3.0, skew=0.2)
    for name in base:
        assert drift[name] == pytest.approx(1.2 * base[name]), name


def test_the_roofline_of_one_op_is_a_float_and_of_many_the_same_elementwise():
    """One op's time is a Python float (calibration writes it to YAML, which refuses numpy
    scalars); over arrays, each entry is the one op's time, bit for bit."""
    from autoplan.cost.compute import roofline_us

    flops = np.array([0.0, 3e9, 7e11, 1e14])
    nbytes = np.array([4e6, 0.0, 1e9, 123.0])
    for low, attention in ((False, False), (True, True)):
        many = roofline_us(BASE, flops, nbytes, low, attention=attention)
        for k in range(len(flops)):
            one = roofline_us(BASE, float(flops[k]), float(nbytes[k]), low, attention=attention)
            assert type(one) is float
            assert one == many[k]
