"""The bucket search under ``auto`` checkpointing and a budget (autoplan.planner.bucket_search):
its solves keep the layers' modes the first solve chose. The search's rules are tested in
tests/unit/planner/test_bucket_search.py."""

from __future__ import annotations

import autoplan.planner.bucket_search as bucket_search
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run
from tests.helpers.runs import TINY_RUN

# A budget counting activations under which auto mixes checkpointing modes per layer.
AUTO = TINY_RUN.replace(
    "plan: {mm_mode: einsum, solver: cbc}",
    "plan: {mm_mode: einsum, solver: cbc, memory_budget_gib: 0.0015, activation_memory: true,"
    " activation_checkpointing: auto}",
)


def test_an_auto_plan_is_searched_with_the_layers_modes_it_chose(tmp_path, monkeypatch):
    """The search is entered and its plan taken whatever its estimate (with its buckets'
    copies priced, the buckets save too little here; that a cheaper plan replaces the
    first is the unit tests'): its solve kept the modes of the first."""
    path = tmp_path / "run.yaml"
    path.write_text(AUTO)
    with monkeypatch.context() as m:
        m.setattr(bucket_search, "WORTH", 0.0)
        m.setattr(bucket_search, "_BETTER", -1.0)  # any plan under twice the first's
        searched = run_plan(load_run(path, []), quiet=True)
    monkeypatch.setattr(bucket_search, "ROUNDS", 0)
    first = run_plan(load_run(path, []), quiet=True)
    assert "checkpointing modes kept" in searched.message
    assert searched.checkpointing == first.checkpointing
    assert searched.shared_launches and not first.shared_launches
