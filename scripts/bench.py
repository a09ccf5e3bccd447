"""Benchmark planning runs: phase seconds, peak RSS, graph and ILP sizes.

Each row plans one run file in a fresh subprocess (so peak RSS is that run's
own) and the table is written to benchmarks/RESULTS.md with the command line.

    python scripts/bench.py                       # the default matrix
    python scripts/bench.py --row configs/tiny.yaml:einsum
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
    "configs/llama3_8b_2l.yaml:einsum:highs",
    "configs/llama3_8b_2l.yaml:native:highs",
    "configs/llama3_8b.yaml:einsum:cbc",
]
PHASES = ("trace", "rewrite", "strategies", "cost", "ilp_build", "solve")


def _child(config: str, mode: str, solver: str) -> None:
    from autoplan.cli import run_plan
    from autoplan.runfile import load_run

    run = load_run(config, [f"plan.mm_mode={mode}", f"plan.solver={solver}"])
    start = time.perf_counter()
    plan = run_plan(run, quiet=True)
    wall = time.perf_counter() - start
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    row = {
        "config": config,
        "mode": mode,
        "solver": solver,
        "wall_s": wall,
        "rss_gb": rss_gb,
        "timings": plan.timings,
        "graph_nodes": plan.graph_nodes,
        "ilp": plan.ilp_size,
        "status": plan.status,
        "objective_ms": plan.objective_us / 1e3,
    }
    print("BENCH " + json.dumps(row))


def _run_row(spec: str) -> dict:
    parts = spec.split(":")
    config, mode = parts[0], parts[1] if len(parts) > 1 else "einsum"
    solver = parts[2] if len(parts) > 2 else "cbc"
    # The child imports this checkout's autoplan, not whichever one the venv installed.
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, __file__, "--child", config, mode, solver],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    return json.loads(line[len("BENCH ") :])


def _table(rows: list[dict]) -> str:
    head = (
        "| run | mode | solver | "
        + " | ".join(PHASES)
        + " | post-trace | wall | peak RSS | nodes | ILP vars / cons | status | objective |"
    )
    sep = "|" + "---|" * (head.count("|") - 1)
    lines = [head, sep]
    for r in rows:
        t = r["timings"]
        post = sum(v for k, v in t.items() if k != "trace")
        lines.append(
            f"| {Path(r['config']).stem} | {r['mode']} | {r['solver']} | "
            + " | ".join(f"{t.get(p, 0):.2f}" for p in PHASES)
            + f" | {post:.2f} | {r['wall_s']:.1f} s | {r['rss_gb']:.2f} GB | {r['graph_nodes']} | "
            f"{r['ilp']['variables']} / {r['ilp']['constraints']} | {r['status']} | {r['objective_ms']:.2f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", action="append", help="CONFIG[:MODE[:SOLVER]]; repeatable")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args()
    rows = []
    for spec in args.row or DEFAULT_ROWS:
        print(f"running {spec} ...", flush=True)
        rows.append(_run_row(spec))
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    text = (
        "# autoplan planning benchmarks\n\n"
        f"Command: `python scripts/bench.py {' '.join(sys.argv[1:])}`  \n"
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}\n\n"
        + _table(rows)
        + "\n"
    )
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
