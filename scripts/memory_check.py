"""The plan's memory estimate per device against the peak one training step measures.

Run: ``python scripts/memory_check.py`` (``--json``: one JSON line per plan; ``--write``:
also rewrite its section of benchmarks/RESULTS.md)

A tiny LLaMA is planned on a 2x2 (dp, tp) mesh of 4 gloo processes, inside the job,
under six settings (no budget; a parameters-only budget that makes it shard; a budget
that counts the saved activations too; selective and full activation checkpointing;
``auto`` with 4 layers on the 4 processes as one data-parallel axis, under a budget that
makes it recompute some layers in full and keep the others), parallelized, and stepped once (forward, a loss
on the local output, backward, AdamW) under PyTorch's ``MemTracker``, after one warm-up
step (the first call lowers the plan and AdamW allocates its state). The table gives,
per setting, the plan's ``memory_breakdown`` and the tracker's peak by category on
rank 0: parameters, optimizer state and activations compare one to one; the tracker
files the gradients the backward is still holding as temporaries, so the plan's
gradients + backward transient compare with its gradients + temporaries.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from results_md import RESULTS, write_section  # scripts/results_md.py: beside this script
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.apply import parallelize, shard_inputs
from autoplan.models.llama3 import Transformer, tiny
from autoplan.strategies.dtensor import MemTracker

WORLD, BATCH, SEQ = 4, 8, 32
# name: (memory_budget_gib, activation_memory, activation_checkpointing, mesh shape, layers)
SETTINGS = {
    "no budget": (None, False, "none", (2, 2), 2),
    "params budget": (0.0006, False, "none", (2, 2), 2),
    "activations budget": (0.003, True, "none", (2, 2), 2),
    "selective": (None, False, "selective", (2, 2), 2),
    "full": (None, False, "full", (2, 2), 2),
    "auto, layers mixed": (0.004, True, "auto", (4,), 4),
}


def measure(
    rank: int,
    budget: float | None,
    activations: bool,
    checkpointing: str,
    shape: tuple[int, ...],
    layers: int,
) -> dict:
    """One setting on this rank: the plan's breakdown and the tracker's peak, in bytes."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[: len(shape)])
    with torch.device("meta"):
        meta = Transformer(tiny(layers))
    config = autoplan.PlanConfig(
        memory_budget_gib=budget,
        activation_memory=activations,
        activation_checkpointing=checkpointing,
    )
    plan = autoplan.plan(
        meta, lambda: torch.randint(0, 128, (BATCH, SEQ)), mesh,
        input_placements="S(0)" + "R" * (len(shape) - 1),
        config=config, broadcast_from=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(tiny(layers))
    model.init_weights(seed=0)
    pm = parallelize(model, plan, mesh)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    (x,) = shard_inputs(torch.randint(0, 128, (BATCH, SEQ)), plan, mesh)

    def step() -> None:
        out = pm(x.to_local())
        out.to_local().float().pow(2).mean().backward()  # a local loss: no collective of its own
        opt.step()
        opt.zero_grad()

    step()
    tracker = MemTracker()
    tracker.track_external(pm, opt)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {
        "checkpointing": [plan.checkpointing[layer] for layer in sorted(plan.checkpointing)],
        "plan": {k: float(v) for k, v in plan.memory_breakdown.items()},
        "measured": {
            str(k.value) if hasattr(k, "value") else str(k): int(v) for k, v in peak.items()
        },
    }


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=timedelta(seconds=300),
    )  # fmt: skip
    try:
        results = {name: measure(rank, *setting) for name, setting in SETTINGS.items()}
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def run() -> dict:
    """Every setting on 4 gloo processes; rank 0's numbers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(port, out), nprocs=WORLD, join=True)
        return json.loads(Path(out, "rank0.json").read_text())


def rows(results: dict) -> list[dict]:
    """Per setting: estimate and measurement by category, in KiB, and their ratio."""
    out = []
    for name, r in results.items():
        plan, seen = r["plan"], r["measured"]
        estimate, total = sum(plan.values()), seen["Total"]
        out.append(
            {
                "setting": name,
                "checkpointing": r["checkpointing"],
                "parameters": (plan["parameters"], seen["Parameter"]),
                "optimizer": (plan["optimizer"], seen["Optstate"]),
                "activations": (plan["activations"], seen["Activation"]),
                "gradients+transient": (
                    plan["gradients"] + plan["transient"],
                    seen["Gradient"] + seen["Temp"],
                ),
                "peak": (estimate, total),
                "ratio": estimate / total,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per setting")
    parser.add_argument(
        "--write", action="store_true", help="rewrite benchmarks/RESULTS.md's table"
    )
    args = parser.parse_args()
    table = rows(run())
    if args.json:
        for row in table:
            print(json.dumps(row))
        return
    cats = ["parameters", "optimizer", "activations", "gradients+transient", "peak"]
    lines = [
        "| setting | layers | "
        + " | ".join(f"{c} KiB (plan / measured)" for c in cats)
        + " | plan / measured |",
        "|---" * (len(cats) + 3) + "|",
    ]
    for row in table:
        cells = [f"{row[c][0] / 1024:.0f} / {row[c][1] / 1024:.0f}" for c in cats]
        layers = ", ".join(row["checkpointing"])
        lines.append(
            f"| {row['setting']} | {layers} | " + " | ".join(cells) + f" | {row['ratio']:.3f} |"
        )
    print("\n".join(lines))
    if args.write:
        write_section(
            RESULTS,
            "memory_check",
            "## Memory per device: the plan's estimate against MemTracker\n\n"
            "`python scripts/memory_check.py --write`: tiny LLaMA (2 layers, batch 8, seq 32) "
            "on 2x2 (dp, tp), 4 gloo processes, rank 0 (auto: 4 layers on 4 dp ranks); one training step after a warm-up "
            "one, under `torch.distributed._tools.mem_tracker.MemTracker`. The tracker files "
            "the gradients the backward still holds as temporaries, so gradients + transient "
            "are compared together.\n\n" + "\n".join(lines),
        )


if __name__ == "__main__":
    main()
