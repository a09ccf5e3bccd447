"""One preparation for plan, explain and compare: rebuild sees the solver's merged groups and twins."""

from __future__ import annotations

import pytest

from autoplan.planner import front_end as front_end_module
from autoplan.planner import problem as priced_problem
from autoplan.planner import solve_mode as solve_stage
from autoplan.tools.cli import main
from autoplan.tools.compare import compare
from autoplan.tools.rebuild import rebuild
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run
from tests.helpers.runs import TINY_RUN

# Four layers, so that layers are tied; a pin on layer 1's wq keeps it out of tying.
PINNED = (
    TINY_RUN.replace("n_layers: 2", "n_layers: 4")
    + "constraints: {pin: {layers.1.attention.wq.weight: S(0)R}}\n"
)
# A budget counting activations under which auto mixes checkpointing modes per layer.
AUTO = TINY_RUN.replace(
    "plan: {mm_mode: einsum, solver: cbc}",
    "plan: {mm_mode: einsum, solver: cbc, memory_budget_gib: 0.0015, activation_memory: true,"
    " activation_checkpointing: auto}",
)
NATIVE = TINY_RUN.replace("mm_mode: einsum", "mm_mode: native")


class _Seen:
    """What the solve stage handed the ILP: the first follower reduction and the first
    tie map (each node's twin representative)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.roots: dict[str, str] | None = None
        self.tie: dict[str, str] | None = None
        collapse, build = solve_stage.collapse_followers, solve_stage.build_ilp

        def collapse_seen(*args, **kwargs):
            reduction = collapse(*args, **kwargs)
            if self.roots is None:
                self.roots = {v: r for v, (r, _) in reduction.roots.items()}
            return reduction

        def build_seen(*args, **kwargs):
            if self.tie is None:
                self.tie = dict(kwargs["tie"] or {})
            return build(*args, **kwargs)

        # auto's reduction is made by the problem it is kept in, the others by the solve
        monkeypatch.setattr(solve_stage, "collapse_followers", collapse_seen)
        monkeypatch.setattr(priced_problem, "collapse_followers", collapse_seen)
        monkeypatch.setattr(solve_stage, "build_ilp", build_seen)


@pytest.mark.parametrize("text", [PINNED, AUTO, NATIVE], ids=["pinned", "auto", "native"])
def test_rebuild_has_the_solvers_merged_groups_and_twins(tmp_path, monkeypatch, text):
    """The follower groups and twin classes rebuild (explain, compare --out) reasons about
    are the ones the planner's ILP was built on, node for node."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    run = load_run(path, [])
    with monkeypatch.context() as patch:
        seen = _Seen(patch)
        plan = run_plan(run, quiet=True)
    assert plan.status == "optimal"
    assert any(v != r for v, r in seen.roots.items()), "no follower merged: nothing checked"
    assert any(v != r for v, r in (seen.tie or {}).items()), "no node tied: nothing checked"
    rb = rebuild(run, plan)
    merged = {v: r for v, r in rb.root.items() if v != r}
    assert merged == {v: r for v, r in seen.roots.items() if v != r}
    assert {v: r for v, r in rb.twin.items() if v != r} == {
        v: r for v, r in seen.tie.items() if v != r
    }
    if text is PINNED:
        node = dict(zip(rb.traced.param_fqns, rb.traced.params, strict=True))
        pinned = node["layers.1.attention.wq.weight"]
        assert rb.twin[pinned] == pinned
        assert all(v == pinned for v, r in rb.twin.items() if r == pinned)


def test_plan_explain_and_compare_trace_through_the_front_end(tmp_path, monkeypatch, capsys):
    """plan, explain and compare --out each reach the trace only through front_end: one
    trace per plan and one per re-pricing."""
    traces = []
    trace = front_end_module.trace_joint
    monkeypatch.setattr(
        front_end_module, "trace_joint", lambda *a, **k: traces.append(1) or trace(*a, **k)
    )
    path = tmp_path / "run.yaml"
    path.write_text(TINY_RUN)
    saved = tmp_path / "plan.json"
    assert main(["plan", str(path), "--out", str(saved), "--quiet"]) == 0
    assert len(traces) == 1
    assert main(["explain", str(saved), "output.weight", "--config", str(path)]) == 0
    assert len(traces) == 2
    result = compare(load_run(path, []), quiet=True, by_kind=True)
    assert len(traces) == 6  # each mode planned, then re-priced per layer kind
    assert all("cost_by_kind" in result[m] for m in ("einsum", "native"))
    capsys.readouterr()
