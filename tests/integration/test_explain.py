"""explain and the per-kind breakdown: re-priced plans, alternatives, named edges, chart."""

from __future__ import annotations

import pytest

from autoplan.result.plan import Plan
from autoplan.tools.rebuild import rebuild
from tests.helpers.runs import EXPLAIN_LLAMA_RUN, plan_saved


@pytest.mark.parametrize("mode", ["none", "auto"])
def test_rebuild_reasons_about_the_groups_and_twins_the_solver_had(tmp_path, mode):
    """explain's merged groups and twins are the solver's, with auto's layer modes too:
    as many nodes merged into a root and tied to a twin as the plan's ILP counted."""
    text = EXPLAIN_LLAMA_RUN.replace("n_layers: 1", "n_layers: 3")
    sets = [f"plan.activation_checkpointing={mode}", "plan.memory_budget_gib=1"]
    run, _, saved = plan_saved(tmp_path, text, sets)
    plan = Plan.load(saved)
    rb = rebuild(run, plan)
    merged = sum(1 for v, r in rb.root.items() if v != r)
    tied = sum(1 for v, r in rb.twin.items() if v != r)
    assert plan.ilp_size["merged"] > 0 and plan.ilp_size["tied"] > 0
    assert (merged, tied) == (plan.ilp_size["merged"], plan.ilp_size["tied"])
