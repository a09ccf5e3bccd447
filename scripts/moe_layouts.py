"""The planner's expert placement against the layouts people pin for mixture-of-experts.

Run: ``python scripts/moe_layouts.py`` (``--write``: also rewrite its section of
benchmarks/RESULTS.md; ``--row N``: one row of ``ROWS`` only)

Each row plans a MoE run file on a two-axis (dp, ep) mesh three ways, with the run
file's prices and bfloat16, under 70 GiB per device counting the saved activations
(Qwen3-30B-A3B on 256 ranks takes a batch of 128 sequences, which dp=32 divides):

- ``planner``: every placement left to the ILP;
- ``EP + FSDP``: every expert weight sharded by expert on ``ep`` and FSDP-sharded on
  ``dp`` (``S(1)S(0)``), every other parameter FSDP-sharded over both axes (``S(0)S(0)``,
  or on its first dimension the ranks divide: the router's ``S(1)S(1)``);
- ``TP experts``: every expert's hidden dimension sharded on ``ep`` (``S(1)S(2)`` for
  ``w1``/``w3``, ``S(2)S(1)`` for ``w2``, FSDP on ``dp``), the rest as above.

The pins fix the parameters only; the ILP plans the activations and the moves around
them. Per plan: the estimated step, its communication by kind (count and time) and the
memory per device.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

from results_md import RESULTS, write_section  # scripts/results_md.py: beside this script

from autoplan.core.placements import fmt, parse
from autoplan.result.plan import Plan
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import Run, load_run

BUDGET = ["plan.memory_budget_gib=70", "plan.activation_memory=true"]
ROWS: list[tuple[str, list[str]]] = [
    ("configs/mixtral_8x7b.yaml", []),
    ("configs/qwen3_30b_a3b.yaml", []),
    ("configs/qwen3_30b_a3b.yaml", ["mesh.shape=[32, 8]", "inputs.batch=128"]),
]
EXPERT = {"w1": "S(1)S(0)", "w3": "S(1)S(0)", "w2": "S(1)S(0)"}
TP_EXPERT = {"w1": "S(1)S(2)", "w3": "S(1)S(2)", "w2": "S(2)S(1)"}
LAYOUTS: dict[str, dict[str, str] | None] = {
    "planner": None,
    "EP + FSDP": EXPERT,
    "TP experts": TP_EXPERT,
}
SHOWN = ("layers.0.feed_forward.experts.w1", "layers.0.feed_forward.experts.w2")


def pins(run: Run, experts: dict[str, str]) -> dict:
    """Every parameter of ``run``'s model pinned: expert weights by ``experts``, the rest
    FSDP-sharded over both axes (on their first dimension that all the ranks divide)."""
    ranks = math.prod(run.mesh_shape)
    out = {}
    for name, p in run.build_model().named_parameters():
        if ".experts." in name:
            text = experts[name.rsplit(".", 1)[-1]]
        else:
            dim = next(d for d, n in enumerate(p.shape) if n % ranks == 0)
            text = f"S({dim})S({dim})"
        out[name] = parse(text)
    return out


def plan_row(config: str, overrides: list[str]) -> list[dict]:
    """The three layouts of one run file, planned."""
    run = load_run(config, [*overrides, *BUDGET])
    if run.axis_names != ("dp", "ep"):
        raise SystemExit(f"{config}: the layouts need a (dp, ep) mesh; it has {run.axis_names}")
    out = []
    for layout, experts in LAYOUTS.items():
        pinned = run if experts is None else dataclasses.replace(run, pins=pins(run, experts))
        start = time.perf_counter()
        plan = run_plan(pinned, quiet=True)
        out.append(_row(config, run, layout, plan, time.perf_counter() - start))
        print(f"  {layout}: {plan.status}, {out[-1]['step_ms']:.1f} ms", file=sys.stderr)
    return out


def _row(config: str, run: Run, layout: str, plan: Plan, wall_s: float) -> dict:
    comm = {k: (c.count, c.us / 1e3) for k, c in sorted(plan.comm.items())}
    return {
        "run": Path(config).stem,
        "mesh": "x".join(map(str, run.mesh_shape)),
        "layout": layout,
        "status": plan.status,
        "step_ms": plan.estimated_step_us / 1e3,
        "comm": comm,
        "memory_gib": sum(plan.memory_breakdown.values()) / 2**30,
        "experts": {n: fmt(plan.param_placements[n]) for n in SHOWN if n in plan.param_placements},
        "wall_s": wall_s,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| run | mesh (dp x ep) | layout | status | step ms | communication: count, ms "
        "| memory GiB | experts.w1 / w2 | plan s |",
        "|---" * 9 + "|",
    ]
    for r in rows:
        comm = ", ".join(f"{k} {n} {ms:.1f}" for k, (n, ms) in r["comm"].items()) or "none"
        shown = " / ".join(f"`{p}`" for p in r["experts"].values())
        lines.append(
            f"| {r['run']} | {r['mesh']} | {r['layout']} | {r['status']} | {r['step_ms']:.1f} "
            f"| {comm} | {r['memory_gib']:.1f} | {shown} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Per run and mesh: the planner's step against the best pinned layout's."""
    out = []
    for key in dict.fromkeys((r["run"], r["mesh"]) for r in rows):
        group = [r for r in rows if (r["run"], r["mesh"]) == key]
        free = next(r for r in group if r["layout"] == "planner")
        pinned = [r for r in group if r["layout"] != "planner" and r["status"] != "infeasible"]
        if not pinned:
            continue
        best = min(pinned, key=lambda r: r["step_ms"])
        shown = " and ".join(f"`{n.rsplit('.', 1)[-1]}` `{p}`" for n, p in free["experts"].items())
        out.append(
            f"- {key[0]} on {key[1]}: the ILP chose {shown} (dp, ep); the better pinned "
            f"layout, {best['layout']}, is estimated {best['step_ms']:.1f} ms, "
            f"{best['step_ms'] / free['step_ms']:.2f}x the planner's {free['step_ms']:.1f} "
            f"ms. Why, by kind (pinned - planner): {_saved(best, free)}; the planner's plan "
            f"holds {free['memory_gib']:.1f} GiB per device against the pins' "
            f"{best['memory_gib']:.1f}, within the 70 GiB budget."
        )
    return out


def _saved(pinned: dict, free: dict) -> str:
    """Per collective kind, the milliseconds ``pinned`` spends beyond ``free``."""
    kinds = sorted(set(pinned["comm"]) | set(free["comm"]))
    cost = {k: pinned["comm"].get(k, (0, 0.0))[1] - free["comm"].get(k, (0, 0.0))[1] for k in kinds}
    return ", ".join(f"{k} {ms:+.1f} ms" for k, ms in sorted(cost.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite benchmarks/RESULTS.md")
    parser.add_argument("--row", type=int, action="append", help="only row N of ROWS")
    args = parser.parse_args()
    rows = []
    for i in args.row or range(len(ROWS)):
        config, overrides = ROWS[i]
        print(f"{config} {' '.join(overrides)}", file=sys.stderr, flush=True)
        rows += plan_row(config, overrides)
    text = "\n".join([table(rows), "", *verdicts(rows)])
    print(text)
    if args.write:
        command = "python scripts/moe_layouts.py --write"
        write_section(
            RESULTS,
            "moe_layouts",
            "## Mixture-of-experts: the planner's expert placement against pinned layouts\n\n"
            f"Command: `{command}`. Estimates on the run files' `h100` prices, bfloat16, "
            "70 GiB per device counting the saved activations; the pins fix every parameter "
            "(see the script's docstring), the ILP places the rest.\n\n" + text,
        )


if __name__ == "__main__":
    main()
