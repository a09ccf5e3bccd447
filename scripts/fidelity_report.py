"""The fidelity harness's report: per model, each plan's error, Spearman's rank
correlation and where the planner's pick lands; the markdown section and the scatter plot.

Input: the plans (their estimates) and the measured median steps of
``scripts/fidelity.py``. Output: the text of its RESULTS section, and a PNG.
Why apart: measuring and reporting are two concerns; the report reads only numbers.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from results_md import ROOT, header  # scripts/results_md.py
from scipy.stats import spearmanr

from autoplan.calibrate.run import cpu_model

TIE = 1e-9
"""Relative difference below which two estimates are the same price."""


def summarize(estimated: dict[str, float], measured: dict[str, float]) -> dict:
    """Per model: each plan's relative error, Spearman's rho, and the pick's rank."""
    names = list(estimated)
    errors = {n: estimated[n] / measured[n] - 1.0 for n in names}
    rho = float(spearmanr([estimated[n] for n in names], [measured[n] for n in names])[0])
    order = sorted(names, key=measured.__getitem__)
    free = [n for n in ("free-4", "free") if n in names] or names
    # estimates equal but for rounding are a tie, which the first listed (the smaller mesh) takes
    least = min(estimated[n] for n in free)
    pick = next(n for n in free if estimated[n] <= least * (1 + TIE))
    return {
        "errors": errors,
        "spearman": rho,
        "pick": pick,
        "pick_rank": 1 + sum(measured[n] < measured[pick] for n in names),
        "pick_over_fastest": measured[pick] / measured[order[0]],
        "fastest": order[0],
    }


def spread(steps: list[float], rounds: int) -> float:
    """How far one plan's own measurements move: the range of its rounds' medians over
    the median of its steps (its steps in order, ``rounds`` equal rounds of them)."""
    per = len(steps) // rounds
    medians = [statistics.median(steps[i * per : (i + 1) * per]) for i in range(rounds)]
    return (max(medians) - min(medians)) / statistics.median(steps)


def plot(points: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    top = 0.0
    for model, pts in points.items():
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, label=model)
        top = max(top, *xs, *ys)
    ax.plot(
        [0, top * 1.05], [0, top * 1.05], color="grey", linewidth=1, label="estimate = measured"
    )
    ax.set_xlabel("measured step, ms")
    ax.set_ylabel("estimated step, ms")
    ax.set_xlim(0, top * 1.05)
    ax.set_ylim(0, top * 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _shown(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def report(
    plans: dict,
    steps: dict,
    same: dict[str, dict[str, str]],
    args: argparse.Namespace,
    topo_name: str,
    world: int,
) -> str:
    """The RESULTS section of the plans' estimates against their measured ``steps``;
    ``same`` names, per model, the candidate whose program each one runs and shares the
    measurement of."""
    medians = {m: {n: statistics.median(t) for n, t in ts.items()} for m, ts in steps.items()}
    lines = [
        *header(
            "Estimated against measured steps",
            "fidelity.py",
            cpu_model(),
            f"{world} processes ({args.device}), topology {topo_name}. Step: forward + "
            f"backward with the loss inside the model; the median over {args.steps} steps, "
            f"the slowest rank, in {args.rounds} rounds in which the candidates take turns, "
            f"each built, warmed up for {args.warmup} steps, timed and freed"
            + (", glibc's malloc keeping freed memory mapped" if args.device == "cpu" else "")
            + ". A plan marked `= other` runs that candidate's very program (the same "
            "placements, buckets and settings) and shares its measurement. "
            "Error: estimated / measured - 1. Spread: the range of the plan's medians over "
            "its rounds, over its median: how far the same plan's measurement moves here.",
        ),
        "",
        "| model | plan | mesh | estimated ms | measured ms | error | spread |",
        "|---|---|---|---|---|---|---|",
    ]
    summary_lines = []
    all_errors = []
    for model, ms in medians.items():
        est = {n: plans[model][n].estimated_step_us / 1e3 for n in ms}
        s = summarize(est, ms)
        all_errors += [abs(e) for e in s["errors"].values()]
        spreads = {n: spread(steps[model][n], args.rounds) for n in ms}
        for n in ms:
            mesh = "x".join(map(str, plans[model][n].mesh_shape))
            shown = n if same[model][n] == n else f"{n} `= {same[model][n]}`"
            lines.append(
                f"| {model} | {shown} | {mesh} | {est[n]:.1f} | {ms[n]:.1f} | {s['errors'][n]:+.0%} "
                f"| {spreads[n]:.0%} |"
            )
        errs = sorted(abs(e) for e in s["errors"].values())
        summary_lines.append(
            f"| {model} | {statistics.median(errs):.0%} | {errs[-1]:.0%} | {s['spearman']:.2f} "
            f"| {s['pick_rank']} of {len(ms)} | {s['pick_over_fastest']:.2f} ({s['fastest']}) "
            f"| {statistics.median(spreads.values()):.0%} |"
        )
    lines += [
        "",
        "| model | median error | worst error | Spearman | the pick's rank | pick / fastest "
        "| median spread |",
        "|---|---|---|---|---|---|---|",
        *summary_lines,
        "",
        f"All plans: median error {statistics.median(all_errors):.0%}, worst "
        f"{max(all_errors):.0%}. Plot: `{_shown(args.plot)}`.",
    ]
    return "\n".join(lines)
