"""A saved plan reads back as the plan that was saved, for every kind of plan the planner
makes (issue 41, item 3): save -> load -> equal, the file written again byte for byte, and
``autoplan diff`` and ``autoplan explain`` accept the file.

The cases span both mm modes, memory budgets, every activation-checkpointing mode, 1-D to
3-D meshes, the reference and Hugging Face model kinds, routes on and off, and the
placements only some plans hold: a route through ``P(avg)`` (a mean over a sharded dim),
a masked partial (the vocab-parallel embedding's) and strided shards. The default suite
plans a few cases that cover them all; the slow sweep plans many more.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from autoplan.core.placements import fmt
from autoplan.result.plan import Plan
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run
from tests.helpers.bad_input import cli
from tests.helpers.paths import CONFIGS

# The two-block MLP with a batch of 4 over (dp, cp): flattening batch and sequence, sharded
# on different axes, makes strided shards (_S(0,4)S(0)) for the native mms.
MLP_RUN = """\
model: {name: mlp, args: {dim: 64, hidden: 256, n_layers: 2}}
inputs: {batch: 4, seq: 32, placements: ["S(1)S(0)"]}
mesh: {shape: [2, 2], names: [dp, cp]}
plan: {mm_mode: native}
topology: h100
"""

MESH_1D = ["mesh.shape=[4]", "mesh.names=[dp]", 'inputs.placements=["S(0)"]']
MESH_3D = ["mesh.shape=[2,2,2]", "mesh.names=[dp,tp,cp]", 'inputs.placements=["S(0)RR"]']

# name: (run file, --set overrides, a placement text some node or route of the plan holds)
CASES = {
    # the reproduction: LLaMA3-8B dims, 2 layers, 8 x 8 mesh, 4 GiB, no loss_fn;
    # the route of add:0 passes P(avg)S(1)
    "llama3_8b_2l": ("llama3_8b_2l.yaml", [], "P(avg)"),
    # a mean and an embedding pinned to the partials only their ops make
    "tiny_pinned_partials": (
        "tiny.yaml",
        ['constraints.pin={mean: "P(avg)P(avg)", embedding: "MaskP(sum,[128,64],0)S(0)"}'],
        "MaskP(sum,[128,64],0)",
    ),
    "mlp_strided_native": ("mlp", [], "_S(0,4)"),
    "tiny_1d_native_no_routes": (
        "tiny.yaml",
        [*MESH_1D, "plan.mm_mode=native", "plan.routes=false"],
        None,
    ),
    "gpt2_selective_budget": (
        "hf_gpt2_tiny.yaml",
        ["plan.activation_checkpointing=selective", "plan.memory_budget_gib=0.01"],
        None,
    ),
    "mlp_3d": ("mlp", [*MESH_3D, "inputs.batch=8", "plan.mm_mode=einsum"], None),
    "hf_llama_full": ("hf_llama_tiny.yaml", ["plan.activation_checkpointing=full"], None),
}


def _run_file(name: str, tmp_path: Path) -> Path:
    if name == "mlp":
        path = tmp_path / "mlp.yaml"
        path.write_text(MLP_RUN)
        return path
    return CONFIGS / name


def _holds(plan: Plan, text: str) -> list[str]:
    """The nodes whose placements, or whose routes, hold ``text``."""
    nodes = [
        n for n, e in plan.node_placements.items() if any(text in p for p in e["out"] + e["in"])
    ]
    routed = [node for (node, _), via in plan.routes.items() if any(text in fmt(p) for p in via)]
    return routed + nodes


def check_round_trip(run_path: Path, overrides: list[str], tmp_path: Path, marker: str | None):
    """Plan the run, save it, and check the file: it loads as the same plan, saves again
    byte for byte, and diff and explain accept it."""
    run = load_run(run_path, overrides)
    plan = run_plan(run, quiet=True)
    assert plan.status != "infeasible", plan.message
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.to_json() == plan.to_json() == path.read_text().rstrip("\n")
    ran = cli("diff", str(path), str(path))
    assert ran.code == 0 and "parameters placed differently: 0" in ran.out, ran.err
    # explain reads every node of the file back against the run's graph, whichever it shows:
    # the node holding the case's rare placement, else a routed node, else a parameter
    names = _holds(plan, marker) if marker is not None else []
    assert marker is None or names, (
        f"no node or route of the plan holds {marker}: pick another case"
    )
    names += [node for node, _ in plan.routes] + list(plan.param_placements)
    sets = [arg for o in overrides for arg in ("--set", o)]
    ran = cli("explain", str(path), names[0], "--config", str(run_path), *sets)
    assert ran.code == 0, ran.err
    assert re.search(rf"\b{re.escape(names[0])}\b", ran.out), ran.out


@pytest.mark.parametrize("case", list(CASES))
def test_saved_plan_reads_back_and_diff_and_explain_take_it(case, tmp_path):
    """The case's plan: save -> load -> equal, saved again byte for byte; diff and explain
    accept the file (explain on the node that holds the case's rare placement)."""
    name, overrides, marker = CASES[case]
    check_round_trip(_run_file(name, tmp_path), overrides, tmp_path, marker)


# The slow sweep: every model kind on 1-D to 3-D meshes, the options rotating over them.
KINDS = {
    "tiny.yaml": ("S(0)", "S(0)R", "S(0)RR"),
    "hf_gpt2_tiny.yaml": ("S(0)", "S(0)R", "S(0)RR"),
    "hf_llama_tiny.yaml": ("S(0)", "S(0)R", "S(0)RR"),
    "mlp": ("S(0)", "S(1)S(0)", "S(0)RR"),
}
MESHES = (([4], ["dp"]), ([2, 2], ["dp", "tp"]), ([2, 2, 2], ["dp", "tp", "cp"]))
OPTIONS = (
    ["plan.mm_mode=einsum"],
    ["plan.mm_mode=native", "plan.routes=false"],
    ["plan.activation_checkpointing=selective"],
    ["plan.activation_checkpointing=full", "plan.mm_mode=native"],
    ["plan.activation_checkpointing=auto", "plan.memory_budget_gib=0.01"],
    ["plan.memory_budget_gib=0.002", "plan.routes=false"],
)
SWEEP = [
    (kind, m, o)
    for k, (kind, m) in enumerate(itertools.product(KINDS, range(len(MESHES))))
    for o in (k % len(OPTIONS), (k + 3) % len(OPTIONS))
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "mesh", "option"), SWEEP)
def test_many_saved_plans_read_back(kind, mesh, option, tmp_path):
    """Every kind on every mesh size under rotating options: the saved plan reads back,
    diff and explain take it."""
    shape, names = MESHES[mesh]
    overrides = [
        f"mesh.shape={shape}".replace(" ", ""),
        f"mesh.names=[{','.join(names)}]",
        f'inputs.placements=["{KINDS[kind][mesh]}"]',
        *OPTIONS[option],
    ]
    check_round_trip(_run_file(kind, tmp_path), overrides, tmp_path, None)


# Every run file of configs/: the small ones in the default suite, the large ones slow.
QUICK_CONFIGS = {"tiny.yaml", "hf_gpt2_tiny.yaml", "hf_llama_tiny.yaml"}
CONFIG_FILES = [
    pytest.param(p, marks=() if p.name in QUICK_CONFIGS else pytest.mark.slow, id=p.stem)
    for p in sorted(CONFIGS.glob("*.yaml"))
]


@pytest.mark.parametrize("run_path", CONFIG_FILES)
def test_every_config_plan_is_read_by_the_codec_that_wrote_it(run_path, tmp_path):
    """Each configs/ run file's plan: loaded equal, written again byte for byte, and every
    record read by its file keys gives what the file holds (typed and JSON views agree)."""
    plan = run_plan(load_run(run_path), quiet=True)
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan and loaded.to_json() + "\n" == path.read_text()
    data = json.loads(path.read_text())
    for name, entry in loaded.node_placements.items():
        assert {k: entry[k] for k in ("op", "out", "in")} == data["node_placements"][name]
        assert entry["out"] == [fmt(p) for p in entry.out]
    assert {str(s): [fmt(p) for p in via] for s, via in loaded.routes.items()} == data["routes"]
    assert [
        {k: b[k] for k in written}
        for b, written in zip(loaded.buckets, data["buckets"], strict=True)
    ] == data["buckets"]
