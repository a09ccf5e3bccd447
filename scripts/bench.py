"""Benchmark planning runs: phase seconds, peak RSS, graph and ILP sizes.

Each row plans one run file in a fresh subprocess (so peak RSS is that run's
own) and the table is written to benchmarks/RESULTS.md with the command line
that reproduces each row.

    python scripts/bench.py                       # the default matrix
    python scripts/bench.py --row configs/tiny.yaml:einsum
    python scripts/bench.py --row configs/llama3_8b.yaml:native:cbc:plan.time_limit_s=300

A row is ``CONFIG[:MODE[:SOLVER[:KEY=VALUE,...]]]``; the KEY=VALUE pairs are
run-file overrides, as ``autoplan plan --set`` takes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
]
PHASES = ("trace", "rewrite", "strategies", "cost", "ilp_build", "solve")


def _child(config: str, mode: str, solver: str, sets: str) -> None:
    from autoplan.cli import run_plan
    from autoplan.runfile import load_run

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
        post = sum(v for k, v in t.items() if k != "trace")
        lines.append(
            f"| {Path(r['config']).stem} | {r.get('layers')} | {r['mode']} | {r['solver']} | "
            + " | ".join(f"{t.get(p, 0):.2f}" for p in PHASES)
            + f" | {post:.2f} | {r['wall_s']:.1f} s | {r['rss_gb']:.2f} GB | {r['graph_nodes']} | "
            f"{_size(r['ilp'], 'plain_')} | {_size(r['ilp'], '')} | {r['status']} | "
            f"{r['objective_ms']:.2f} ms |"
        )
    return "\n".join(lines)


def _commands(rows: list[dict]) -> str:
    return "\n".join(f"- `python scripts/bench.py --row {r['spec']}`" for r in rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", action="append", help="CONFIG[:MODE[:SOLVER[:K=V,...]]]")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args()
    rows = []
    for spec in args.row or DEFAULT_ROWS:
        print(f"running {spec} ...", flush=True)
        try:
            rows.append(_run_row(spec))
        except subprocess.CalledProcessError as exc:
            print(f"failed: {spec}\n{exc.stderr[-2000:]}", flush=True)
            continue
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    text = (
        "# autoplan planning benchmarks\n\n"
        f"Command: `{' '.join(['python scripts/bench.py', *sys.argv[1:]])}`  \n"
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. Peak RSS: the planning process's (CBC runs as a "
        "subprocess and is not counted). *plain*: the ILP with one variable per strategy "
        "and finite edge price, before follower merging, tying, pruning and folding; "
        "*solved*: what the solver got.\n\n" + _table(rows) + "\n\nEach row alone:\n\n"
        f"{_commands(rows)}\n"
    )
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
