"""The plan's memory estimate per device against the peak one training step measures.

Run: ``python scripts/memory_check.py`` (``--table settings`` or ``--table step``: one of
the two tables; ``--json``: one JSON line per row; ``--write``: also rewrite its section
of benchmarks/RESULTS.md)

Each row's model is planned inside a job of 4 gloo processes, parallelized, and stepped
once (forward, loss, backward, AdamW) under PyTorch's ``MemTracker``, after one warm-up
step (the first call lowers the plan and AdamW allocates its state). A row gives the
plan's ``memory_breakdown`` and the tracker's peak by category on rank 0: parameters,
optimizer state and activations compare one to one; the tracker files the gradients and
everything else the backward holds as temporaries, so the plan's gradients + output's
gradient + backward transient compare with its gradients + temporaries.

* ``settings``: tiny LLaMA (2 layers, batch 8, seq 32) on a 2x2 (dp, tp) mesh under six
  settings: no budget; a parameters-only budget that makes it shard; a budget that
  counts the saved activations too; selective and full activation checkpointing; and
  ``auto`` with 4 layers on the 4 processes as one data-parallel axis, under a budget
  that makes it recompute some layers. The loss is computed on the local output.
* ``step``: the README's step at a longer sequence (dim 128, 2 layers, vocabulary 256,
  batch 8 x seq 512, 2x2, input ``S(0)R``) with each checkpointing mode, the loss outside
  (``out.sum().full_tensor() / out.numel()``, the mean of the logits computed on the
  returned DTensor) and inside (``loss_fn``). A last row steps DTensor's
  ``out.mean().full_tensor()``, whose backward makes the output's gradient replicated at
  its full size on every rank, which the plan does not count (docs/memory.md).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from results_md import RESULTS, write_section  # scripts/results_md.py: beside this script
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.core.torch_adapter import MemTracker
from autoplan.core.user_files import write_text
from autoplan.models.llama3 import ModelArgs, Transformer, tiny
from autoplan.runtime.apply import parallelize, shard_inputs
from autoplan.trace.capture import mean_loss

WORLD = 4
README_MODEL = ModelArgs(
    dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32, max_seq_len=512
)


@dataclass(frozen=True)
class Setting:
    """One row: the model, its batch, the mesh, the plan's config and the loss.

    ``loss``: ``local`` (on the output's local shard), ``outside`` (the mean computed on
    the returned DTensor as a sum, whose backward broadcasts), ``mean`` (DTensor's
    ``mean``) or ``inside`` (``loss_fn``, in the planned graph).
    """

    name: str
    model: ModelArgs
    batch: int
    seq: int
    shape: tuple[int, ...] = (2, 2)
    checkpointing: str = "none"
    budget: float | None = None
    activations: bool = False
    loss: str = "local"


def _settings() -> list[Setting]:
    small = {"model": tiny(2), "batch": 8, "seq": 32}
    return [
        Setting("no budget", **small),
        Setting("params budget", **small, budget=0.0006),
        Setting("activations budget", **small, budget=0.003, activations=True),
        Setting("selective", **small, checkpointing="selective"),
        Setting("full", **small, checkpointing="full"),
        Setting("auto", tiny(4), 8, 32, (4,), "auto", budget=0.004),
    ]


def _step_rows() -> list[Setting]:
    modes = [("none", None), ("selective", None), ("full", None), ("auto", 0.031)]
    rows = [
        Setting(
            f"{mode}, loss {loss}", README_MODEL, 8, 512, checkpointing=mode, budget=b, loss=loss
        )
        for mode, b in modes
        for loss in ("outside", "inside")
    ]
    return [*rows, Setting("none, DTensor's out.mean()", README_MODEL, 8, 512, loss="mean")]


TABLES = {"settings": _settings, "step": _step_rows}
LOSSES = {
    "local": lambda out: out.to_local().float().pow(2).mean(),  # no collective of its own
    "outside": lambda out: out.sum().full_tensor() / out.numel(),
    "mean": lambda out: out.mean().full_tensor(),
}


def measure(setting: Setting) -> dict:
    """One row on this rank: the plan's breakdown and the tracker's peak, in bytes."""
    shape = setting.shape
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[: len(shape)])
    vocab = setting.model.vocab_size
    tokens = torch.randint(0, vocab, (setting.batch, setting.seq), generator=_seeded())
    inside = setting.loss == "inside"
    with torch.device("meta"):
        meta = Transformer(setting.model)
    config = autoplan.PlanConfig(
        memory_budget_gib=setting.budget,
        activation_memory=setting.activations,
        activation_checkpointing=setting.checkpointing,
    )
    plan = autoplan.plan(
        meta, lambda: tokens, mesh, input_placements="S(0)" + "R" * (len(shape) - 1),
        config=config, broadcast_from=0, loss_fn=mean_loss if inside else None,
    )  # fmt: skip
    model = Transformer(setting.model)
    model.init_weights(seed=0)
    pm = parallelize(model, plan, mesh, loss_fn=mean_loss if inside else None)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    (x,) = shard_inputs(tokens, plan, mesh)

    def step() -> None:
        out = pm(x)  # held through the loss and the backward, as a caller holds it
        (out if inside else LOSSES[setting.loss](out)).backward()
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


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _worker(rank: int, port: int, out: str, settings: list[dict]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=timedelta(seconds=900),
    )  # fmt: skip
    try:
        results = [measure(_setting(s)) for s in settings]
        write_text(Path(out, f"rank{rank}.json"), json.dumps(results))
    finally:
        dist.destroy_process_group()


def _setting(d: dict) -> Setting:
    return Setting(**(d | {"model": ModelArgs(**d["model"]), "shape": tuple(d["shape"])}))


def run(settings: list[Setting]) -> list[dict]:
    """Every row on 4 gloo processes; rank 0's numbers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        args = (port, out, [asdict(s) for s in settings])
        mp.spawn(_worker, args=args, nprocs=WORLD, join=True)
        return json.loads(Path(out, "rank0.json").read_text())


def rows(table: str, settings: list[Setting], results: list[dict]) -> list[dict]:
    """Per row: estimate and measurement by category, in bytes, and their ratio."""
    out = []
    for setting, r in zip(settings, results, strict=True):
        plan, seen = r["plan"], r["measured"]
        backward = plan["gradients"] + plan["output_grad"] + plan["transient"]
        estimate, total = sum(plan.values()), seen["Total"]
        out.append(
            {
                "table": table,
                "setting": setting.name,
                "checkpointing": r["checkpointing"],
                "parameters": (plan["parameters"], seen["Parameter"]),
                "optimizer": (plan["optimizer"], seen["Optstate"]),
                "activations": (plan["activations"], seen["Activation"]),
                "backward": (backward, seen["Gradient"] + seen["Temp"]),
                "peak": (estimate, total),
                "ratio": estimate / total,
            }
        )
    return out


CATEGORIES = ["parameters", "optimizer", "activations", "backward", "peak"]


def markdown(table: list[dict], unit: str, scale: float) -> str:
    """A table of plan / measured per category (in ``unit``) and the peak's ratio."""
    lines = [
        "| setting | layers | "
        + " | ".join(f"{c} {unit} (plan / measured)" for c in CATEGORIES)
        + " | plan / measured |",
        "|---" * (len(CATEGORIES) + 3) + "|",
    ]
    digits = 0 if unit == "KiB" else 2
    for row in table:
        cells = [
            f"{row[c][0] / scale:.{digits}f} / {row[c][1] / scale:.{digits}f}" for c in CATEGORIES
        ]
        layers = ", ".join(row["checkpointing"])
        lines.append(
            f"| {row['setting']} | {layers} | " + " | ".join(cells) + f" | {row['ratio']:.3f} |"
        )
    return "\n".join(lines)


INTRO = (
    "## Memory per device: the plan's estimate against MemTracker\n\n"
    "`python scripts/memory_check.py --write`: each plan made in a job of 4 gloo processes "
    "and stepped once (forward, loss, backward, AdamW) after a warm-up step, under "
    "`torch.distributed._tools.mem_tracker.MemTracker`, rank 0. The tracker files what the "
    "backward holds as gradients and temporaries, so the plan's gradients + output's "
    "gradient + backward transient (*backward*) are compared with them together; the peak "
    "also holds the buffers (RoPE tables), which the plan does not count."
)
SETTINGS_INTRO = (
    "Tiny LLaMA (2 layers, batch 8, seq 32) on 2x2 (dp, tp), the loss computed on the "
    "local output (auto: 4 layers on 4 dp ranks, 0.004 GiB):"
)
STEP_INTRO = (
    "The README's step at a longer sequence: LLaMA with dim 128, 2 layers, 4 heads, "
    "2 kv heads, vocabulary 256, batch 8 x seq 512, 2x2 (dp, tp), input `S(0)R`; the loss "
    "outside (`out.sum().full_tensor() / out.numel()` on the returned logits, held "
    "through the backward) or inside (`loss_fn=lambda out: out.float().mean()`); auto "
    "under 0.031 GiB:"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=sorted(TABLES), help="one table (default: both)")
    parser.add_argument("--json", action="store_true", help="one JSON line per row")
    parser.add_argument(
        "--write", action="store_true", help="rewrite benchmarks/RESULTS.md's section"
    )
    args = parser.parse_args()
    names = [args.table] if args.table else list(TABLES)
    chosen = {name: TABLES[name]() for name in names}
    results = run([s for settings in chosen.values() for s in settings])
    tables: dict[str, list[dict]] = {}
    for name, settings in chosen.items():
        tables[name] = rows(name, settings, results[: len(settings)])
        results = results[len(settings) :]
    if args.json:
        for table in tables.values():
            for row in table:
                print(json.dumps(row))
        return
    text = [INTRO]
    if "settings" in tables:
        text += [SETTINGS_INTRO, markdown(tables["settings"], "KiB", 1024)]
    if "step" in tables:
        *counted, mean = tables["step"]
        over = mean["peak"][1] - counted[0]["peak"][1]
        text += [
            STEP_INTRO,
            markdown(counted, "MB", 1e6),
            f"DTensor's own `out.mean().full_tensor()` (the same mean) measured "
            f"{mean['peak'][1] / 1e6:.2f} MB with no checkpointing, {over / 1e6:.2f} MB "
            f"above the sum's: its backward divides the broadcast gradient, making it a "
            f"replicated tensor of the logits' full size on every rank, which the plan "
            f"does not count (plan / measured {mean['ratio']:.3f}).",
        ]
    print("\n\n".join(text))
    if args.write and not args.table:
        write_section(RESULTS, "memory_check", "\n\n".join(text))


if __name__ == "__main__":
    main()
