"""The plan file's codec (autoplan.result.records): every value the writer can emit is
read back as the same plan (issue 43: a P(avg) route was once written and then refused at
the load), checked on random plans over every placement kind in every place a plan holds
placements, and the records read by their JSON keys give what the file holds."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

from autoplan.core.config import CHECKPOINT_MODES, PlanConfig
from autoplan.core.placements import REDUCE_OPS, Placements, fmt
from autoplan.core.torch_adapter import Partial, Replicate, Shard, _StridedShard, masked_partial
from autoplan.result.plan import Plan
from autoplan.result.records import (
    BREAKDOWN_KEYS,
    STATUSES,
    Bucket,
    CommTotal,
    NodePlacement,
    Slot,
)

NDIM = 3  # every tensor of the random plans has 3 dims, so any S(d) with d < 3 fits


def every_placement() -> list[Any]:
    """One of each placement kind the planner can write: shards, strided shards, R, the
    sum partial, a partial of every other reduction and the masked partials."""
    out: list[Any] = [Replicate(), Partial()]
    out += [Shard(d) for d in range(NDIM)]
    out += [_StridedShard(d, split_factor=k) for d in range(NDIM) for k in (1, 2, 4)]
    out += [Partial(op) for op in REDUCE_OPS if op != "sum"]
    out += [masked_partial("sum", [128, 64], 0), masked_partial("max", None, 1)]
    return out


KINDS = every_placement()
# A masked partial equals another only as the same object (DTensor compares its mask
# buffer by identity): a node's placements compare it by short form, and it is never a
# parameter's placement nor a route's hop (only the embedding's op makes it, no move).
MOVABLE = [p for p in KINDS if not fmt((p,)).startswith("MaskP")]


def placements(rng: random.Random, num_axes: int, kinds: list[Any] = KINDS) -> Placements:
    return tuple(rng.choice(kinds) for _ in range(num_axes))


def random_plan(seed: int) -> Plan:
    """A consistent plan (node names, slots, axes, kinds agree) with random values."""
    rng = random.Random(seed)
    num_axes = rng.randint(1, 3)
    names = ("dp", "tp", "cp")[:num_axes]
    nodes = {"xs_1": NodePlacement("placeholder", (placements(rng, num_axes),), ())}
    for i in range(rng.randint(1, 12)):
        out = tuple(rng.choice([None, placements(rng, num_axes)]) for _ in range(rng.randint(1, 3)))
        ins = tuple(rng.choice([None, placements(rng, num_axes)]) for _ in range(rng.randint(0, 3)))
        nodes[f"op_{i}"] = NodePlacement(rng.choice(["aten.mm.default", "getitem"]), out, ins)
    slots = [Slot(n, k) for n, e in nodes.items() for k in range(len(e.inputs))]
    routes = {
        s: tuple(placements(rng, num_axes, MOVABLE) for _ in range(rng.randint(1, 3)))
        for s in rng.sample(slots, rng.randint(0, len(slots)))
    }
    comm = {
        kind: CommTotal(rng.randint(0, 50), rng.random() * 1e9, rng.random() * 1e3)
        for kind in rng.sample(["all_gather", "all_reduce", "reduce_scatter", "all_to_all"], 2)
    }
    buckets = [
        Bucket(
            kind=rng.choice(sorted(comm)),
            where=rng.choice(["head", "tail"]),
            axes=tuple(sorted(rng.sample(range(num_axes), rng.randint(1, num_axes)))),
            members=rng.randint(2, 40),
            bytes=rng.random() * 1e8,
            us=rng.random() * 100,
            us_alone=rng.random() * 300,
        )
        for _ in range(rng.randint(0, 3))
    ]
    params = {
        f"layers.{i}.w.weight": placements(rng, num_axes, MOVABLE) for i in range(rng.randint(0, 4))
    }
    status = rng.choice([s for s in STATUSES if s != "infeasible"])
    cost = rng.random() * 1e4
    return Plan(
        status=status,
        param_placements=params,
        node_placements=nodes,
        routes=routes,
        buckets=buckets,
        checkpointing={f"layers.{i}": rng.choice(CHECKPOINT_MODES) for i in range(2)},
        recompute=rng.sample(sorted(nodes), rng.randint(0, 2)),
        objective_us=cost,
        compute_us=cost / 3,
        comm_us=cost * 2 / 3,
        bound_us=rng.choice([None, -cost, cost * 0.9]),
        comm=comm,
        memory_bytes=rng.random() * 2**40,
        memory_breakdown={k: rng.random() * 2**30 for k in rng.sample(BREAKDOWN_KEYS, 3)},
        ilp_size={"variables": rng.randint(0, 10**6), "constraints": rng.randint(0, 10**6)},
        graph_nodes=len(nodes),
        message=rng.choice(["", "optimal among tied plans: ü"]),
        stats={"strided_shard_chosen": float(rng.randint(0, 5)), "signed": -rng.random()},
        fallback_ops=tuple(rng.sample(["aten.arange.default", "aten.foo.default"], 1)),
        mesh_shape=tuple(rng.randint(1, 8) for _ in range(num_axes)),
        axis_names=names,
        config=PlanConfig().to_dict(),
        param_shapes={fqn: (4, 8, 16) for fqn in params},
        input_shapes=((8, 32, 64),),
        input_keys=(rng.choice([0, "tokens"]),),
        loss_fn=rng.choice(["mean", "none"]),
        graph_fingerprint=f"{rng.getrandbits(256):064x}",
    )


@pytest.mark.parametrize("seed", range(40))
def test_a_random_plan_reads_back_equal_and_saves_again_byte_for_byte(seed):
    """Plan -> JSON -> Plan is the same plan and the same text, over every placement kind
    in parameters, node outputs and inputs (and "-" for no tensor) and route hops."""
    plan = random_plan(seed)
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == text


def test_the_random_plans_hold_every_placement_kind_in_every_place():
    """The property above covers each kind in nodes, parameters and routes."""
    seen: dict[str, set[str]] = {"node": set(), "param": set(), "route": set()}
    for seed in range(40):
        plan = random_plan(seed)
        for e in plan.node_placements.values():
            seen["node"] |= {fmt((p,)) for ps in e.out + e.inputs if ps for p in ps}
        seen["param"] |= {fmt((p,)) for ps in plan.param_placements.values() for p in ps}
        seen["route"] |= {fmt((p,)) for via in plan.routes.values() for ps in via for p in ps}
    kinds = {fmt((p,)) for p in KINDS}
    movable = {fmt((p,)) for p in MOVABLE}
    assert seen == {"node": kinds, "param": movable, "route": movable}


@pytest.mark.parametrize("hop", [p for p in KINDS if fmt((p,)).startswith("P(")])
def test_a_route_through_a_partial_only_its_op_makes_reads_back(hop):
    """The issue's case: a route through P(avg) (or another reduction's partial) saves
    and loads as the same plan."""
    base = random_plan(0)
    node = NodePlacement("aten.add.Tensor", ((Shard(1),) * 2,), ((Shard(1),) * 2,))
    plan = Plan(
        **{f: getattr(base, f) for f in ("status", "objective_us", "compute_us", "comm_us")},
        param_placements={},
        node_placements={"add": node},
        routes={Slot("add", 0): ((hop, Shard(1)),)},
        ilp_size={},
        mesh_shape=(2, 2),
        axis_names=("dp", "tp"),
    )
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.routes[("add", 0)][0][0] is not None
    assert json.loads(plan.to_json())["routes"] == {"add:0": [f"{fmt((hop,))}S(1)"]}


def test_records_read_by_their_json_keys_give_what_the_file_holds():
    """plan.node_placements[n]["out"], plan.comm[k]["count"], plan.buckets[i]["kind"]: the
    file's values, as scripts written against the JSON read them."""
    for seed in range(10):
        plan = random_plan(seed)
        data = json.loads(plan.to_json())
        for name, entry in plan.node_placements.items():
            assert {k: entry[k] for k in ("op", "out", "in")} == data["node_placements"][name]
        for kind, c in plan.comm.items():
            assert {k: c[k] for k in ("count", "bytes", "us")} == data["comm"][kind]
            assert c.get("count") == c.count and c.get("nope", 0) == 0
        for b, written in zip(plan.buckets, data["buckets"], strict=True):
            assert {k: b[k] for k in written} == written
        with pytest.raises(KeyError):
            next(iter(plan.node_placements.values()))["inputs"]  # the file's key is "in"


def test_a_masked_partial_anywhere_is_read_back_as_written():
    """A masked partial in a parameter's placements or a route's hop, which the planner
    never makes, is still read back: the same text, the same placements by short form."""
    base = random_plan(0)
    masked = (masked_partial("sum", [128, 64], 0), Shard(1))
    node = NodePlacement("aten.add.Tensor", (masked,), (masked,))
    plan = dataclasses.replace(
        base,
        param_placements={"w": masked},
        param_shapes={"w": (128, 64)},
        node_placements={"add": node},
        routes={Slot("add", 0): (masked,)},
        recompute=[],
        mesh_shape=(2, 2),
        axis_names=("dp", "tp"),
        input_shapes=(),
        input_keys=(),
    )
    again = Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert again.node_placements == plan.node_placements
    assert fmt(again.param_placements["w"]) == fmt(again.routes[("add", 0)][0]) == fmt(masked)
