"""explain and the per-kind breakdown: re-priced plans, alternatives, named edges, chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autoplan.core.placements import fmt
from autoplan.result.plan import Plan
from autoplan.tools.chart import KINDS, cost_by_kind, layer_kind, node_kinds
from autoplan.tools.cli import main
from autoplan.tools.compare import write_compare
from autoplan.tools.explain import explain, format_explain
from autoplan.tools.rebuild import PlanMismatchError, rebuild
from autoplan.tools.runfile import load_run
from autoplan.trace.capture import trace_joint
from tests.helpers.paths import REPO
from tests.helpers.runs import EXPLAIN_LLAMA_RUN, EXPLAIN_MLP_RUN, plan_saved

# Devices slow enough that the EXPLAIN_MLP_RUN's compute, not the per-kernel floor, sets its time, so
# data parallelism (keeping the batch sharded) beats computing replicated.
SLOW_DEVICES = (
    "{device: {name: slow, peak_bf16_tflops: 0.01, peak_fp32_tflops: 0.01, hbm_gbps: 10, "
    "memory_gib: 80}}"
)


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """A tiny EXPLAIN_MLP_RUN planned with no follower merging and no tying: the ILP is exact."""
    run, config, saved = plan_saved(tmp_path_factory.mktemp("exact"))
    return rebuild(run, Plan.load(saved)), config, saved


def test_rebuilt_costs_are_the_plans(exact):
    """Re-pricing the saved plan gives its compute, comm and memory, node by node summed."""
    rb, _, _ = exact
    compute = sum(rb.node_cost(v)[0] for v in rb.table.nodes)
    comm = sum(rb.node_cost(v)[1] for v in rb.table.nodes)
    memory = sum(float(m[rb.choice[p]]) for p, m in rb.costs.memory.items())
    assert compute == pytest.approx(rb.plan.compute_us, rel=1e-9)
    assert comm == pytest.approx(rb.plan.comm_us, rel=1e-9)
    assert memory == pytest.approx(rb.plan.memory_bytes, rel=1e-9)


def test_no_single_move_beats_an_exact_plan(exact):
    """Every alternative of every node, neighbours fixed, costs at least the plan (solver check)."""
    rb, _, _ = exact
    checked = 0
    for v in rb.table.nodes:
        r = explain(rb, v, top=10_000)
        deltas = [a["delta_us"] for a in r["alternatives"]]
        assert deltas == sorted(deltas)
        for a in r["alternatives"]:
            assert a["delta_us"] >= -1e-6 * rb.plan.objective_us, (v, a)
            assert a["delta_us"] == pytest.approx(a["compute_delta_us"] + a["comm_delta_us"])
            assert sum(e["delta_us"] for e in a["edges"]) == pytest.approx(
                a["comm_delta_us"], abs=1e-6
            )
        checked += len(deltas)
    assert checked > 100


def test_parameter_explained_by_fqn(exact):
    """A parameter FQN resolves to its placeholder; memory and the gradient edge are reported."""
    rb, _, _ = exact
    r = explain(rb, "layers.0.w1.weight", top=3)
    assert r["parameter"] == "layers.0.w1.weight" and r["node"] in rb.traced.params
    assert r["strategy"] == fmt(rb.plan.param_placements["layers.0.w1.weight"])
    assert r["memory_bytes"] == float(rb.costs.memory[r["node"]][rb.choice[r["node"]]])
    assert any(e["edge"].startswith("gradient ") for e in r["edges"])
    assert len(r["alternatives"]) == 3
    assert "memory" in format_explain(r)


def test_alternative_names_the_input_edge_and_its_all_gather(tmp_path):
    """With the input fixed to S(0) on dp, reading it replicated costs an all_gather over dp on that edge."""
    run, _, saved = plan_saved(
        tmp_path,
        EXPLAIN_MLP_RUN.replace("[2, 2], names: [dp, tp]", "[4], names: [dp]")
        .replace('"S(0)R"', '"S(0)"')
        .replace("topology: h100", f"topology: {SLOW_DEVICES}"),
    )
    rb = rebuild(run, Plan.load(saved))
    (x,) = rb.traced.inputs
    first = next(
        n.name
        for n in rb.traced.gm.graph.nodes
        if n.target is not None and "einsum" in str(n.target)
    )
    r = explain(rb, first, top=10_000)
    replicated = [a for a in r["alternatives"] if a["strategy"].startswith("(R,")]
    assert replicated, r["alternatives"]
    for a in replicated:
        named = [e for e in a["edges"] if e["edge"] == f"input {x} -> {first}[0]"]
        assert named and "all_gather over dp" in named[0]["alternative"], a
        assert named[0]["delta_us"] > 0
        assert named[0]["chosen"] == "S(0), no move"


def test_explain_cli_text_json_and_bad_names(exact, capsys):
    """explain prints the report (or JSON); a bad name exits 2 listing close matches."""
    _, config, saved = exact
    assert main(["explain", saved, "layers.1.w2.weight", "--config", config, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "parameter layers.1.w2.weight" in out and "next best of" in out
    assert main(["explain", saved, "layers.1.w2.weight", "--config", config, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["parameter"] == "layers.1.w2.weight" and len(result["alternatives"]) <= 5
    assert main(["explain", saved, "layers.1.w2.weigth", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "layers.1.w2.weigth" in err and "close matches: layers.1.w2.weight" in err


def test_plan_from_another_run_file_is_refused(exact, capsys):
    """A plan made with another mesh or model exits 2 naming what differs."""
    rb, config, saved = exact
    assert main(["explain", saved, "t", "--config", config, "--set", "mesh.shape=[4, 1]"]) == 2
    assert "mesh: plan [2, 2]" in capsys.readouterr().err
    assert main(["explain", saved, "t", "--config", config, "--set", "model.args.dim=32"]) == 2
    assert "model parameters differ" in capsys.readouterr().err
    with pytest.raises(PlanMismatchError, match="mm_mode"):
        rebuild(load_run(config, ["plan.mm_mode=native"]), rb.plan)


def test_node_kinds_of_a_llama(tmp_path):
    """Parameter readers take their parameter's kind; RMSNorm's internals are norm."""
    path = tmp_path / "llama.yaml"
    path.write_text(EXPLAIN_LLAMA_RUN)
    run = load_run(path)
    traced = trace_joint(run.build_model(), run.input_fn())
    kinds = node_kinds(traced)
    by_fqn = dict(zip(traced.param_fqns, traced.params, strict=True))
    assert kinds[by_fqn["layers.0.attention.wq.weight"]] == "attention"
    assert layer_kind("layers.0.ffn_norm.weight") == "norm"
    assert layer_kind("tok_embeddings.weight") == "embedding"
    assert layer_kind("output.weight") == "output"
    targets = {n.name: str(n.target) for n in traced.gm.graph.nodes}
    assert (
        kinds[next(v for v, t in targets.items() if t.startswith("aten.embedding."))] == "embedding"
    )
    assert kinds[next(v for v, t in targets.items() if t.startswith("aten.pow."))] == "norm"
    sdpa = [v for v, t in targets.items() if "scaled_dot_product" in t]
    assert sdpa and all(kinds[v] == "attention" for v in sdpa)
    assert set(kinds.values()) <= set(KINDS)


def test_compare_chart_numbers_sum_to_each_plan(tmp_path, capsys):
    """compare --out writes JSON and a PNG whose per-kind numbers add up to each mode's totals."""
    path = tmp_path / "run.yaml"
    path.write_text(
        EXPLAIN_MLP_RUN.replace(
            "collapse_followers: false, cluster_layers: false", "cluster_layers: true"
        )
        .replace("[2, 2], names: [dp, tp]", "[4], names: [dp]")
        .replace('"S(0)R"', '"S(0)"')
    )
    out = tmp_path / "cmp"
    out.mkdir()
    assert main(["compare", str(path), "--out", str(out) + "/"]) == 0
    assert "per layer kind" in capsys.readouterr().out
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    result = json.loads((out / "compare.json").read_text())
    for mode in ("einsum", "native"):
        row = result[mode]
        kinds = row["cost_by_kind"]
        assert set(kinds) == set(KINDS)
        assert sum(k["compute_us"] for k in kinds.values()) == pytest.approx(row["compute_us"])
        assert sum(k["comm_us"] for k in kinds.values()) == pytest.approx(row["comm_us"])
        assert kinds["feed_forward"]["compute_us"] > kinds["other"]["compute_us"]


def test_write_compare_next_to_a_file(tmp_path, exact):
    """--out X.json puts the chart at X.png; cost_by_kind of one plan sums to it."""
    rb, _, _ = exact
    kinds = cost_by_kind(rb)
    assert math.isclose(sum(k["comm_us"] for k in kinds.values()), rb.plan.comm_us)
    result = {"einsum": {"cost_by_kind": kinds}, "native": {"status": "infeasible"}}
    json_path, png_path = write_compare(result, tmp_path / "x.json", "t")
    assert png_path == tmp_path / "x.png" and png_path.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(json_path.read_text())["einsum"]["cost_by_kind"] == kinds


def test_a_worse_choice_is_reported_as_missed(exact, tmp_path):
    """A plan edited to a worse placement shows the original as a cheaper alternative, by the same delta."""
    rb, _, saved = exact
    fqn = "layers.0.w1.weight"
    before = explain(rb, fqn, top=10_000)
    worse = next(a for a in before["alternatives"] if a["delta_us"] > 1.0)
    data = json.loads(Path(saved).read_text())
    data["param_placements"][fqn] = worse["strategy"]
    data["node_placements"][before["node"]]["out"] = [worse["strategy"]]
    edited = Plan.from_json(json.dumps(data))
    after = explain(rebuild(rb.run, edited), fqn, top=1)
    (best,) = after["alternatives"]
    assert best["strategy"] == before["strategy"]
    assert best["delta_us"] == pytest.approx(-worse["delta_us"])
    assert "missed a better plan" in format_explain(after)


QWEN2_DP4_CALIBRATED = """
model:
  hf: qwen2
  config: {num_hidden_layers: 2, hidden_size: 256, intermediate_size: 768,
           num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 1024,
           max_position_embeddings: 128}
inputs: {batch: 8, seq: 128, placements: ["S(0)"]}
mesh: {shape: [4], names: [dp]}
topology: TOPOLOGY
"""


def test_a_plan_solved_with_shared_launches_is_rebuilt_with_them(tmp_path):
    """A plan the bucket search replaced (its gradients' all-reduce charged shares of one
    launch) is re-priced as its solve priced it: its choice costs its objective."""
    topology = REPO / "benchmarks" / "cpu-gloo-2x2.yaml"
    run, _, saved = plan_saved(tmp_path, QWEN2_DP4_CALIBRATED.replace("TOPOLOGY", str(topology)))
    plan = Plan.load(saved)
    assert plan.shared_launches == (("tail", "all_reduce", (0,)),)
    rb = rebuild(run, plan)
    edges = sum(
        float(e.cost[e.src_group[rb.choice[e.src]], e.dst_group[rb.choice[e.dst]]])
        for e in rb.costs.edges
    )
    compute = sum(float(rb.costs.compute[v][i]) for v, i in rb.choice.items())
    assert compute + edges == pytest.approx(plan.objective_us, rel=1e-9)
