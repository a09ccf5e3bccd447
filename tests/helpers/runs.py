"""Run-file texts (YAML) that plan cleanly, for the tests of the CLI, run files and errors.

A test that needs a broken file makes it from one of these with ``str.replace``, so the
one mistake it checks is the only thing wrong.
"""

from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run

# The two-block MLP on 8 data-parallel ranks under a 0.001 GiB budget.
GOOD_RUN = """
model: {name: mlp, args: {dim: 64, hidden: 256, n_layers: 2}}
inputs: {batch: 16, seq: 32, placements: ["S(0)"]}
mesh: {shape: [8], names: [dp]}
plan: {mm_mode: einsum, memory_budget_gib: 0.001}
topology: h100
"""

# A tiny LLaMA run file that plans in about a second on a 2 x 2 fake mesh.
TINY_RUN = """\
model:
  name: llama3
  args: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 128, multiple_of: 32, max_seq_len: 32}
inputs: {batch: 8, seq: 32, placements: ["S(0)R"]}
mesh: {shape: [2, 2], names: [dp, tp]}
plan: {mm_mode: einsum, solver: cbc}
topology: h100
"""


# The two-block MLP on a 2 x 2 mesh, followers and layers kept apart: the explain tests.
EXPLAIN_MLP_RUN = """
model: {name: mlp, args: {dim: 64, hidden: 256, n_layers: 2}}
inputs: {batch: 16, seq: 32, placements: ["S(0)R"]}
mesh: {shape: [2, 2], names: [dp, tp]}
plan: {mm_mode: einsum, collapse_followers: false, cluster_layers: false}
topology: h100
"""


# A one-layer LLaMA on 2 data-parallel ranks.
EXPLAIN_LLAMA_RUN = """
model: {name: llama3, args: {dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 1, vocab_size: 64,
        multiple_of: 32, max_seq_len: 16}}
inputs: {batch: 4, seq: 16}
mesh: {shape: [2], names: [dp]}
"""


def plan_saved(tmp_path, text=EXPLAIN_MLP_RUN, overrides=()):
    """``text`` written as a run file under ``tmp_path`` and planned, the plan saved beside it:
    the run, the run file's path and the saved plan's path."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    run = load_run(path, list(overrides))
    saved = tmp_path / "plan.json"
    run_plan(run, quiet=True).save(saved)
    return run, str(path), str(saved)
