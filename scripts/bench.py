"""Benchmark planning runs: phase seconds, peak RSS, graph and ILP sizes.

Each row plans one run file in a fresh subprocess (so peak RSS is that run's
own) and the table is written to benchmarks/RESULTS.md with the command line
that reproduces each row.

    python scripts/bench.py                       # the default matrix
    python scripts/bench.py --row configs/tiny.yaml:einsum
    python scripts/bench.py --row configs/llama3_8b.yaml:native:cbc:plan.time_limit_s=300
    python scripts/bench.py --repeat 3             # each row 3 times, the median of each figure
    python scripts/bench.py --section moe --row configs/mixtral_8x7b.yaml:einsum  # a table of its own
    python scripts/bench.py --section frontier     # LLaMA3-405B on a 4-D mesh

A row is ``CONFIG[:MODE[:SOLVER[:KEY=VALUE,...]]]``; the KEY=VALUE pairs are
run-file overrides, as ``autoplan plan --set`` takes them. With ``--repeat N``
each row runs N times and every time and RSS figure is the median of its N
values (on a shared 2-core machine one run's phases move by 10-40 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_md import write_section  # scripts/results_md.py: a script's folder is on sys.path

ROOT = Path(__file__).resolve().parent.parent
REAL_BUDGET = (
    "plan.param_dtype=bfloat16,plan.reduce_dtype=float32,plan.memory_budget_gib=70,"
    "plan.activation_memory=true"
)
DEFAULT_ROWS = [
    "configs/llama3_8b_2l.yaml:einsum:cbc",
    "configs/llama3_8b_2l.yaml:native:cbc",
    "configs/llama3_8b.yaml:einsum:cbc:model.args.n_layers=8",
    "configs/llama3_8b.yaml:native:cbc:model.args.n_layers=8",
    "configs/llama3_8b.yaml:einsum:cbc",
    "configs/llama3_8b.yaml:native:cbc:plan.time_limit_s=300",
    "configs/llama3_8b.yaml:einsum:highs",
    "configs/llama3_70b.yaml:einsum:cbc",
    "configs/llama3_70b.yaml:einsum:highs",
    "configs/llama3_70b.yaml:native:cbc",
    # activation checkpointing chosen per layer, in bfloat16 under what an 80 GB H100 holds
    *(
        f"configs/{name}.yaml:{mode}:cbc:{REAL_BUDGET},plan.activation_checkpointing=auto"
        for name in ("llama3_8b", "llama3_70b")
        for mode in ("einsum", "native")
    ),
]
# `--section frontier` with no --row: the 4-D mesh (the run file's `auto` under 70 GiB
# counting activations takes about 12 minutes here), and without recomputation under a
# budget of parameters, gradients and optimizer state alone
PARAMS_ONLY = "plan.activation_checkpointing=none,plan.activation_memory=false"
FRONTIER_ROWS = [
    "configs/llama3_405b.yaml:einsum:cbc",
    f"configs/llama3_405b.yaml:einsum:cbc:{PARAMS_ONLY}",
]
PHASES = ("trace", "rewrite", "strategies", "cost", "recompute", "ilp_build", "solve")


def _child(config: str, mode: str, solver: str, sets: str) -> None:
    from autoplan.tools.run_plan import run_plan
    from autoplan.tools.runfile import load_run

    overrides = [f"plan.mm_mode={mode}", f"plan.solver={solver}"]
    overrides += [s for s in sets.split(",") if s]
    run = load_run(config, overrides)
    start = time.perf_counter()
    plan = run_plan(run, quiet=True)
    wall = time.perf_counter() - start
    row = {
        "wall_s": wall,
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "timings": plan.timings,
        "graph_nodes": plan.graph_nodes,
        "ilp": plan.ilp_size,
        "status": plan.status,
        "objective_ms": plan.objective_us / 1e3,
        "layers": run.model_args.get("n_layers"),
    }
    print("BENCH " + json.dumps(row))


def _parse(spec: str) -> tuple[str, str, str, str]:
    parts = spec.split(":", 3)
    parts += ["einsum", "cbc", ""][len(parts) - 1 :]
    return parts[0], parts[1], parts[2], parts[3]


def _run_row(spec: str) -> dict:
    config, mode, solver, sets = _parse(spec)
    # The child imports this checkout's autoplan, not whichever one the venv installed.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, "--child", config, mode, solver, sets],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    row = json.loads(line[len("BENCH ") :])
    row |= {"spec": spec, "config": config, "mode": mode, "solver": solver}
    return row


def _median(runs: list[dict]) -> dict:
    """The first run, with each phase time, the wall time and the RSS the median of all."""
    row = dict(runs[0])
    row["timings"] = {
        p: statistics.median(r["timings"][p] for r in runs) for p in runs[0]["timings"]
    }
    # post-trace is the median of the runs' own sums, not the sum of the phase medians
    row["post_s"] = statistics.median(
        sum(v for k, v in r["timings"].items() if k != "trace") for r in runs
    )
    for key in ("wall_s", "rss_gb"):
        row[key] = statistics.median(r[key] for r in runs)
    row["runs"] = len(runs)
    return row


def _size(ilp: dict, pre: str) -> str:
    return f"{ilp.get(pre + 'variables', 0)} / {ilp.get(pre + 'constraints', 0)}"


def _table(rows: list[dict]) -> str:
    head = (
        "| run | layers | mode | solver | "
        + " | ".join(PHASES)
        + " | post-trace | wall | peak RSS | graph nodes "
        "| ILP vars / cons plain | ILP vars / cons solved | status | objective |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        t = r["timings"]
        post = r.get("post_s", sum(v for k, v in t.items() if k != "trace"))
        lines.append(
            f"| {_label(r)} | {r.get('layers')} | {r['mode']} | {r['solver']} | "
            + " | ".join(f"{t.get(p, 0):.2f}" for p in PHASES)
            + f" | {post:.2f} | {r['wall_s']:.1f} s | {r['rss_gb']:.2f} GB | {r['graph_nodes']} | "
            f"{_size(r['ilp'], 'plain_')} | {_size(r['ilp'], '')} | {r['status']} | "
            f"{r['objective_ms']:.2f} ms |"
        )
    return "\n".join(lines)


def _label(row: dict) -> str:
    """The run file, and the real-budget and params-only rows' settings."""
    stem = Path(row["config"]).stem
    if PARAMS_ONLY in row["spec"]:
        return f"{stem}, none, params-only budget"
    return f"{stem}, bf16 70 GiB, auto" if REAL_BUDGET in row["spec"] else stem


def _commands(rows: list[dict], section: str) -> str:
    into = "" if section == "planning" else f" --section {section}"
    return "\n".join(
        f"- `python scripts/bench.py{into} --row {r['spec']}"
        + (f" --repeat {r['runs']}`" if r.get("runs", 1) > 1 else "`")
        for r in rows
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", action="append", help="CONFIG[:MODE[:SOLVER[:K=V,...]]]")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per row; figures are their medians"
    )
    parser.add_argument(
        "--section", default="planning", help="the RESULTS.md section the table replaces"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be 1 or more, got {args.repeat}")
    rows = []
    defaults = FRONTIER_ROWS if args.section == "frontier" else DEFAULT_ROWS
    for spec in args.row or defaults:
        print(f"running {spec} ...", flush=True)
        try:
            runs = []
            for k in range(args.repeat):
                runs.append(_run_row(spec))
                if args.repeat > 1:
                    print(f"  run {k + 1}/{args.repeat}: {_table(runs[-1:]).splitlines()[-1]}")
            rows.append(_median(runs))
        except subprocess.CalledProcessError as exc:
            print(f"failed: {spec}\n{exc.stderr[-2000:]}", flush=True)
            continue
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    title = "planning" if args.section == "planning" else f"planning: {args.section}"
    text = (
        f"# autoplan {title} benchmarks\n\n"
        f"Command: `{' '.join(['python scripts/bench.py', *sys.argv[1:]])}`  \n"
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. Peak RSS: the planning process's (CBC runs as a "
        "subprocess and is not counted). *plain*: the ILP with one variable per strategy "
        "and finite edge price, before follower merging, tying, pruning and folding; "
        "*solved*: what the solver got."
        + (
            f" Times and RSS are the medians of {args.repeat} runs of each row."
            if args.repeat > 1
            else ""
        )
        + "\n\n"
        + _table(rows)
        + "\n\nEach row alone:\n\n"
        f"{_commands(rows, args.section)}\n"
    )
    write_section(args.out, args.section, text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
