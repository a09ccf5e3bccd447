"""Saved plans that are wrong: refused at the load, naming the file, the key, the value
and the fix (issue "No traceback, no silent acceptance"); explain and parallelize refuse
a plan that does not fit before they report or distribute anything."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from autoplan.core.mesh import fake_mesh
from autoplan.core.placements import parse
from autoplan.result.plan import Plan
from autoplan.runtime.apply import parallelize
from autoplan.tools.runfile import load_run
from tests.helpers.bad_input import assert_clear, assert_plan_error, cli
from tests.helpers.runs import TINY_RUN

WQ = "layers.0.attention.wq.weight"
FIX = ("re-plan", "--out")  # every message on a bad field says how to get a good plan


@dataclasses.dataclass(frozen=True)
class Saved:
    """The one valid plan of the session and the run file that made it."""

    run: Path
    plan: Path

    def data(self) -> dict[str, Any]:
        return json.loads(self.plan.read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Saved:
    where = tmp_path_factory.mktemp("saved")
    run, plan = where / "run.yaml", where / "plan.json"
    run.write_text(TINY_RUN)
    ran = cli("plan", str(run), "--out", str(plan), "--quiet")
    assert ran.code == 0, ran.err
    return Saved(run, plan)


def edited(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], Path], Path]:
    """A bad plan: the valid one's JSON after ``change``."""

    def make(data: dict[str, Any], path: Path) -> Path:
        change(data)
        path.write_text(json.dumps(data, indent=1))
        return path

    return make


def text(body: str | bytes) -> Callable[[dict[str, Any], Path], Path]:
    """A bad plan file holding ``body`` (a function of the valid JSON's text if callable)."""

    def make(data: dict[str, Any], path: Path) -> Path:
        raw = body(json.dumps(data, indent=1)) if callable(body) else body
        path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        return path

    return make


def place(fqn: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["param_placements"].__setitem__(fqn, value)


def directory(data: dict[str, Any], path: Path) -> Path:
    path.mkdir()
    return path


def missing(data: dict[str, Any], path: Path) -> Path:
    return path


# id -> (how to make the bad file, words its error must hold beyond the file's name)
BAD = {
    "S(9)S(9)": (
        edited(place(WQ, "S(9)S(9)")),
        [f'param_placements["{WQ}"]', "S(9)S(9)", "2 dims", "dims 0..1", *FIX],
    ),
    "three-placements-on-2-axes": (
        edited(place(WQ, "S(0)RR")),
        [f'param_placements["{WQ}"]', "3 placements", "2 axes (dp, tp)", *FIX],
    ),
    "unparseable-X(0)": (
        edited(place(WQ, "X(0)")),
        [f'param_placements["{WQ}"]', "X(0)", "does not parse", "S(d)", *FIX],
    ),
    "no-param_placements": (
        edited(lambda d: d.pop("param_placements")),
        ["param_placements is missing", *FIX],
    ),
    "no-node_placements": (
        edited(lambda d: d.pop("node_placements")),
        ["node_placements is missing", *FIX],
    ),
    "param_placements-a-list": (
        edited(lambda d: d.__setitem__("param_placements", ["RR"])),
        ["param_placements = [", "not a JSON object", *FIX],
    ),
    "status-great": (
        edited(lambda d: d.__setitem__("status", "great")),
        ['status = "great"', '"optimal"', *FIX],
    ),
    "objective-abc": (
        edited(lambda d: d.__setitem__("objective_us", "abc")),
        ['objective_us = "abc"', "not a number", *FIX],
    ),
    "objective-NaN": (
        edited(lambda d: d.__setitem__("objective_us", math.nan)),
        ["objective_us = NaN", "not finite", *FIX],
    ),
    "bound-infinite": (
        edited(lambda d: d.__setitem__("bound_us", math.inf)),
        ["bound_us = Infinity", "not finite", *FIX],
    ),
    "truncated": (text(lambda t: t[: len(t) // 2]), ["not valid JSON", "line", *FIX]),
    "empty": (text(""), ["is empty", *FIX]),
    "json-array": (text("[1, 2]"), ["an array", "not a plan object", *FIX]),
    "directory": (directory, ["is a directory", "--out"]),
    "no-such-file": (missing, ["no such plan file", "--out"]),
    "not-utf8": (text(b'{"status": "\xff\xfe"}'), ["not UTF-8", "0xff", "--out"]),
    "mesh-size-0": (
        edited(lambda d: d.__setitem__("mesh_shape", [2, 0])),
        ["mesh_shape[1] = 0", ">= 1", *FIX],
    ),
    "unknown-key": (
        edited(lambda d: d.__setitem__("objectve_us", 1.0)),
        ['"objectve_us"', "not a plan key", '"objective_us"', *FIX],
    ),
    "axis-names-repeated": (
        edited(lambda d: d.__setitem__("axis_names", ["dp", "dp"])),
        ['axis_names[1] = "dp"', "names two axes", *FIX],
    ),
    "axis-names-short": (
        edited(lambda d: d.__setitem__("axis_names", ["dp"])),
        ["axis_names", "1 axes, not 2", *FIX],
    ),
    "node-one-placement": (
        edited(lambda d: d["node_placements"]["add"].__setitem__("out", ["S(0)"])),
        ['node_placements["add"]["out"][0]', "1 placements", *FIX],
    ),
    "input-shards-dim-2": (
        edited(lambda d: d["node_placements"]["xs_1"].__setitem__("out", ["S(2)R"])),
        ['node_placements["xs_1"]["out"][0]', "shards dim 2", "[8, 32]", *FIX],
    ),
    "recompute-unknown-node": (
        edited(lambda d: d.__setitem__("recompute", ["no_such_node"])),
        ['recompute[0] = "no_such_node"', "not a planned node", *FIX],
    ),
    "route-unknown-node": (
        edited(lambda d: d.__setitem__("routes", {"no_such_node:0": ["RR"]})),
        ['routes["no_such_node:0"]', "node:slot", *FIX],
    ),
    "node-partial-of-no-reduction": (
        edited(lambda d: d["node_placements"]["add"].__setitem__("out", ["P(foo)R"])),
        ['node_placements["add"]["out"][0] = "P(foo)R"', "does not parse", "P(op)", *FIX],
    ),
    "route-sum-spelled-P(sum)": (
        edited(lambda d: d.__setitem__("routes", {"add:0": ["P(sum)R"]})),
        ['routes["add:0"][0] = "P(sum)R"', "does not parse", "P (a pending sum)", *FIX],
    ),
    "config-mm_mode": (
        edited(lambda d: d["config"].__setitem__("mm_mode", "fast")),
        ['config["mm_mode"] = "fast"', "einsum", *FIX],
    ),
    "checkpointing-mode": (
        edited(lambda d: d["checkpointing"].__setitem__("layers.0", "some")),
        ['checkpointing["layers.0"] = "some"', '"selective"', *FIX],
    ),
    "param-shape-negative": (
        edited(lambda d: d["param_shapes"].__setitem__("norm.weight", [-64])),
        ['param_shapes["norm.weight"][0] = -64', ">= 0", *FIX],
    ),
    "param-without-shape": (
        edited(place("layers.9.wq.weight", "RR")),
        ['param_placements["layers.9.wq.weight"]', "param_shapes lacks", *FIX],
    ),
    "comm-count-text": (
        edited(lambda d: d["comm"]["all_gather"].__setitem__("count", "two")),
        ['comm["all_gather"]["count"] = "two"', "not a number", *FIX],
    ),
    "shared-launch-axis-2-on-2-axes": (
        edited(lambda d: d.__setitem__("shared_launches", [["tail", "all_reduce", [2]]])),
        ["shared_launches[0][2][0] = 2", "not a mesh axis", "0..1", *FIX],
    ),
    "shared-launch-in-the-middle": (
        edited(lambda d: d.__setitem__("shared_launches", [["middle", "all_reduce", [0]]])),
        ['shared_launches[0][0] = "middle"', "head", "tail", *FIX],
    ),
    "repeated-key": (
        text(lambda t: t.replace('"status": "optimal"', '"status": "optimal", "status": "great"')),
        ['repeats the key "status"', *FIX],
    ),
}


@pytest.fixture(params=list(BAD), ids=list(BAD))
def bad(request, saved, tmp_path) -> tuple[Path, list[str]]:
    make, words = BAD[request.param]
    return make(saved.data(), tmp_path / "bad.json"), words


def test_the_valid_plan_loads_and_diffs_clean(saved):
    """The session's valid plan loads and diffs against itself with exit 0."""
    assert Plan.load(saved.plan).status == "optimal"
    ran = cli("diff", str(saved.plan), str(saved.plan))
    assert ran.code == 0 and "parameters placed differently: 0" in ran.out, ran.err


def test_bad_plan_is_refused_by_diff(bad, saved):
    """autoplan diff, the bad plan on either side: exit 2, no traceback, the key and the fix."""
    path, words = bad
    for argv in ((str(path), str(saved.plan)), (str(saved.plan), str(path))):
        assert_clear(cli("diff", *argv), 2, str(path), *words)


def test_bad_plan_is_refused_by_explain(bad, saved):
    """autoplan explain --config: exit 2, no traceback, the key and the fix."""
    path, words = bad
    ran = cli("explain", str(path), WQ, "--config", str(saved.run))
    assert_clear(ran, 2, str(path), *words)


def test_bad_plan_is_refused_by_plan_load(bad):
    """Plan.load raises a PlanError naming the file, the key and the fix."""
    path, words = bad
    assert_plan_error(lambda: Plan.load(path), str(path), *words)


def test_bad_plan_text_is_refused_by_from_json(saved):
    """Plan.from_json names the source it is given, as Plan.load names the path."""
    data = saved.data()
    data["param_placements"][WQ] = "S(9)S(9)"
    assert_plan_error(
        lambda: Plan.from_json(json.dumps(data), source="rank 0's plan"),
        "rank 0's plan",
        f'param_placements["{WQ}"]',
        "re-plan",
    )


def test_infeasible_plan_still_loads(saved, tmp_path):
    """A saved infeasible plan (NaN times, nothing placed) loads: NaN is its recorded value."""
    data = saved.data() | {"status": "infeasible", "message": "infeasible: too small"}
    data |= {"param_placements": {}, "node_placements": {}, "routes": {}, "buckets": []}
    data |= {"objective_us": math.nan, "compute_us": math.nan, "comm_us": math.nan}
    path = tmp_path / "infeasible.json"
    path.write_text(json.dumps(data))
    assert Plan.load(path).status == "infeasible"
    assert cli("diff", str(path), str(saved.plan)).code == 0


def test_explain_reports_the_placement_the_file_holds(saved, tmp_path):
    """A placement edited in both places the file records it is the one explain reports."""
    ran = cli("explain", str(saved.plan), WQ, "--config", str(saved.run), "--json")
    node = json.loads(ran.out)["node"]  # the parameter's graph node
    data = saved.data()
    data["param_placements"][WQ] = "S(0)R"
    data["node_placements"][node]["out"] = ["S(0)R"]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    ran = cli("explain", str(path), WQ, "--config", str(saved.run), "--json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out)["strategy"] == "S(0)R"


def test_explain_refuses_a_placement_edited_in_one_place(saved, tmp_path):
    """param_placements edited but not the parameter's node: explain exits 2 naming both."""
    data = saved.data()
    data["param_placements"][WQ] = "S(0)R"
    path = tmp_path / "half-edited.json"
    path.write_text(json.dumps(data))
    ran = cli("explain", str(path), WQ, "--config", str(saved.run))
    assert_clear(ran, 2, f'param_placements["{WQ}"] = "S(0)R"', "node_placements", *FIX)


def _mesh():
    return fake_mesh((2, 2), ("dp", "tp"))


def test_parallelize_refuses_a_plan_for_another_model(saved):
    """parallelize with another model's plan raises a PlanError naming a parameter."""
    plan = Plan.load(saved.plan)
    other = nn.Sequential(nn.Linear(64, 64))
    assert_plan_error(lambda: parallelize(other, plan, _mesh()), "'0.weight'", "not in the plan")
    wider = load_run(saved.run, ["model.args.dim=128"]).build_model()
    assert_plan_error(
        lambda: parallelize(wider, plan, _mesh()), "'tok_embeddings.weight' has shape", "plan"
    )
    model = load_run(saved.run).build_model()
    del model.norm  # a parameter the plan places but the model lacks: another model
    assert_plan_error(lambda: parallelize(model, plan, _mesh()), "'norm.weight'", "does not have")


def test_parallelize_refuses_placements_that_do_not_fit_a_parameter(saved):
    """A plan without recorded shapes whose placement shards a dim the parameter lacks, or
    gives another number of mesh axes: a PlanError naming the parameter, before DTensor."""
    plan = dataclasses.replace(Plan.load(saved.plan), param_shapes={})
    model = load_run(saved.run).build_model()
    for placements in ("S(1)R", "R"):
        where = dict(plan.param_placements) | {"norm.weight": parse(placements)}
        bad = dataclasses.replace(plan, param_placements=where)
        assert_plan_error(
            lambda b=bad: parallelize(model, b, _mesh()), "'norm.weight'", "dims 0..0"
        )


def test_infeasible_plan_is_strict_json(tmp_path):
    """An infeasible plan saves its missing costs as null (strict JSON) and loads them as NaN."""
    run = tmp_path / "run.yaml"
    run.write_text(TINY_RUN)
    out = tmp_path / "infeasible.json"
    ran = cli(
        "plan", str(run), "--quiet", "--out", str(out), "--set", "plan.memory_budget_gib=1e-7"
    )
    assert ran.code == 1
    data = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert data["objective_us"] is None and data["status"] == "infeasible"
    loaded = Plan.load(out)
    assert math.isnan(loaded.objective_us) and loaded.to_json() == out.read_text().strip()
