"""Real budgets: LLaMA3-8B and -70B in bfloat16 under a budget an 80 GB H100 has.

Run: ``python scripts/memory_budgets.py`` (``--write``: also rewrite its section of
benchmarks/RESULTS.md; ``--row N``: one row of ``ROWS`` only)

Each row plans a run file with overrides in a fresh process and prints the plan's
memory per device by category, its checkpointing choice, its estimated step and the
wall seconds of the ``autoplan.plan`` call: the parameters-only budget the run file
sets, against 70 GiB counting the saved activations with no, full and ``auto``
checkpointing (``auto`` in both mm modes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from results_md import RESULTS, write_section  # scripts/results_md.py: beside this script

ROOT = Path(__file__).resolve().parent.parent
BF16 = ["plan.param_dtype=bfloat16", "plan.reduce_dtype=float32"]
H100 = ["plan.memory_budget_gib=70", "plan.activation_memory=true"]
ROWS: list[tuple[str, list[str]]] = [
    (f"configs/{name}.yaml", BF16 + extra)
    for name in ("llama3_8b", "llama3_70b")
    for extra in (
        [],
        H100 + ["plan.activation_checkpointing=none"],
        H100 + ["plan.activation_checkpointing=full"],
        H100 + ["plan.activation_checkpointing=auto"],
        H100 + ["plan.activation_checkpointing=auto", "plan.mm_mode=native"],
    )
]
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "output_grad", "transient")


def _child(config: str, overrides: list[str]) -> None:
    from autoplan.tools.run_plan import run_plan
    from autoplan.tools.runfile import load_run

    run = load_run(config, overrides)
    start = time.perf_counter()
    plan = run_plan(run, quiet=True)
    row = {
        "wall_s": time.perf_counter() - start,
        "status": plan.status,
        "message": plan.message,
        "budget_gib": plan.config.get("memory_budget_gib"),
        "counts_activations": bool(
            plan.config.get("activation_memory")
            or plan.config.get("activation_checkpointing") == "auto"
        ),
        "asked": plan.config.get("activation_checkpointing"),
        "checkpointing": sorted(set(plan.checkpointing.values())),
        "memory": plan.memory_breakdown,
        "step_ms": plan.objective_us / 1e3,
    }
    print("ROW " + json.dumps(row))


def run_row(config: str, overrides: list[str]) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, "--child", config, *overrides],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    row = json.loads(next(x for x in out.splitlines() if x.startswith("ROW "))[4:])
    return row | {"config": config, "overrides": overrides}


def table(rows: list[dict]) -> str:
    gib = 2**30
    lines = [
        "| run file | mm | budget | checkpointing | status | params | grads | optimizer "
        "| saved activations | output's gradient | transient | peak GiB | step ms | plan s |",
        "|---" * 14 + "|",
    ]
    for r in rows:
        budget = f"{r['budget_gib']:g} GiB " + (
            "incl. activations" if r["counts_activations"] else "params+grads+optimizer"
        )
        chosen = ", ".join(r["checkpointing"]) or "none"
        if r["asked"] == "auto":
            chosen = f"auto -> {chosen}"
        m = r["memory"]
        cells = [f"{m.get(c, 0.0) / gib:.2f}" for c in CATEGORIES] if m else ["-"] * 6
        peak = f"{sum(m.values()) / gib:.2f}" if m else "-"
        step = f"{r['step_ms']:.1f}" if r["status"] != "infeasible" else "-"
        lines.append(
            f"| `{Path(r['config']).name}` | {_mm_mode(r)} | {budget} | {chosen} | {r['status']} | "
            + " | ".join(cells)
            + f" | {peak} | {step} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def _mm_mode(row: dict) -> str:
    """The row's mm mode: its override, else the run files' own (einsum)."""
    return next(
        (o.split("=", 1)[1] for o in row["overrides"] if o.startswith("plan.mm_mode=")), "einsum"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite benchmarks/RESULTS.md")
    parser.add_argument("--row", type=int, action="append", help="only row N of ROWS")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1:])
        return
    rows = []
    for i in args.row or range(len(ROWS)):
        config, overrides = ROWS[i]
        print(f"{config} {' '.join(overrides)}", file=sys.stderr, flush=True)
        rows.append(run_row(config, overrides))
    text = table(rows)
    print(text)
    for r in rows:
        if r["status"] == "infeasible":
            print(f"{r['config']}: {r['message']}")
    if args.write:
        write_section(
            RESULTS,
            "memory_budgets",
            "## Real budgets: LLaMA3 in bfloat16 on 80 GB H100s\n\n"
            "`python scripts/memory_budgets.py --write`: each run file with "
            "`plan.param_dtype=bfloat16, plan.reduce_dtype=float32` (float32 masters, "
            "gradients and AdamW state), first under its own parameters-only budget, then "
            "under 70 GiB counting the saved activations (`plan.activation_memory=true`). "
            "Memory per device in GiB, as the plan reports it; plan s: the wall time of "
            "the `autoplan.plan` call, trace included, on this 2-core machine.\n\n" + text,
        )


if __name__ == "__main__":
    main()
