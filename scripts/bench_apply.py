"""Step time of ``autoplan.parallelize`` against PyTorch's own wrappers on the same placements.

A tiny LLaMA (dim 256, 4 layers, 8 heads, 4 kv heads, vocab 1024, seq 128, batch 8) on 4
gloo processes. Each case plans on a fake mesh with every parameter pinned to the layout
PyTorch's wrapper gives it (the activations left to the solver), then runs, in the same
spawn and on the same weights and batch, the wrapper and the parallelized model:

- ``ddp``: every parameter ``R`` on dp=4, against ``DistributedDataParallel``;
- ``fsdp``: every parameter ``S(0)`` on dp=4, against ``fully_shard`` per block + root;
- ``tp``: torchtitan's layout on (dp=2, tp=2) (wq/wk/wv/w1/w3 colwise ``S(0)`` on tp,
  wo/w2 rowwise ``S(1)`` on tp, everything ``S(0)`` on dp), against ``parallelize_module``
  with ``ColwiseParallel``/``RowwiseParallel`` and ``fully_shard`` on dp.

A step is forward + backward + SGD; the figure is the median over ``--steps`` steps after
``--warmup`` (each step's time is the slowest rank's), the sides taking turns step by
step. ``--compile`` adds the
parallelized model with ``compile=True``. Writes its section of benchmarks/RESULTS.md.

    python scripts/bench_apply.py [--steps 10] [--warmup 2] [--compile] [--case ddp ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_steps import free_port, layout_pins, timed_ms  # scripts/gloo_steps.py
from results_md import RESULTS, header, write_section  # scripts/results_md.py (the script's folder)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

import autoplan
from autoplan.core.topology import Device, Topology
from autoplan.core.user_files import write_text
from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.result.plan import Plan
from autoplan.runtime.apply import input_placements, parallelize, shard_inputs
from autoplan.tools.runfile import load_topology

WORLD = 4
ARGS = ModelArgs(
    dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=1024, multiple_of=64, max_seq_len=128
)
BATCH, SEQ = 8, 128
COLWISE = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROWWISE = ("attention.wo", "feed_forward.w2")
CASES = {  # name: (mesh shape, axis names, input placement, baseline)
    "ddp": ((WORLD,), ("dp",), "S(0)", "DistributedDataParallel"),
    "fsdp": ((WORLD,), ("dp",), "S(0)", "fully_shard per block + root"),
    "tp": ((2, 2), ("dp", "tp"), "S(0)R", "parallelize_module (colwise/rowwise) + fully_shard"),
}


def _pins(case: str, model: torch.nn.Module) -> dict[str, str]:
    """Every parameter's placement under the wrapper the case compares with, and the
    embedding's output batch-sharded on dp as the wrappers run it (left free, the solver
    may slice the replicated embedding by hidden dim and gather it: another algorithm)."""
    out = {"embedding": "S(0)" if case != "tp" else "S(0)R"}
    for fqn, _ in model.named_parameters():
        if case == "ddp":
            out[fqn] = "R"
        elif case == "fsdp":
            out[fqn] = "S(0)"
        else:
            out[fqn] = layout_pins([fqn], COLWISE, ROWWISE)[fqn]
    return out


# This machine, roughly: a CPU core's float32 throughput and memory bandwidth. With GPU
# figures the solver would rather replicate the tiny model's compute than sum gradients,
# which is not the data parallelism the wrappers run.
CPU = Topology(
    device=Device(
        "cpu", peak_bf16_tflops=0.02, peak_fp32_tflops=0.02, hbm_gbps=10.0, memory_gib=24.0
    )
)


def _plan(case: str, mm_mode: str = "einsum", topology: Topology = CPU) -> Plan:
    shape, names, placement, _ = CASES[case]
    with torch.device("meta"):
        model = Transformer(ARGS)
    return autoplan.plan(
        model,
        lambda: torch.randint(0, ARGS.vocab_size, (BATCH, SEQ)),
        autoplan.fake_mesh(shape, names),
        config=autoplan.PlanConfig(solver="highs", topology=topology, mm_mode=mm_mode),
        input_placements=[placement],
        pins=_pins(case, model),
    )


def _baseline(case: str, model: torch.nn.Module, mesh) -> torch.nn.Module:
    if case == "ddp":
        return DistributedDataParallel(model)
    if case == "fsdp":
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    tp = mesh["tp"]
    for block in model.layers:
        plan = {m: ColwiseParallel() for m in COLWISE} | {m: RowwiseParallel() for m in ROWWISE}
        parallelize_module(block, tp, plan)
        block.attention.n_heads //= tp.size()  # local heads, as torchtitan's attention reads
        block.attention.n_kv_heads //= tp.size()
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def _loss(logits: torch.Tensor) -> torch.Tensor:
    """The step's loss: the mean of the logits (of this rank's rows for the wrappers; of
    the planned output DTensor, reduced by DTensor, for the parallelized model)."""
    return logits.float().mean()


def _interleaved(steps: dict, n: int, warmup: int) -> dict[str, float]:
    """Median step time per side, the sides taking turns step by step (a machine whose
    speed drifts slows them alike)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + n):
        for name, step in steps.items():
            ms, _ = timed_ms(step)
            if i >= warmup:
                times[name].append(ms)
    return {name: statistics.median(t) for name, t in times.items()}


def _first_loss(loss: torch.Tensor) -> float:
    """A DTensor loss is reduced for printing only (after the clock)."""
    return float(loss.full_tensor() if isinstance(loss, DTensor) else loss)


def _sgd_step(model, opt, call):
    def step():
        loss = call()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _worker(rank: int, port: int, cases: dict, opts: dict, compile: bool, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=timedelta(seconds=600),
    )  # fmt: skip
    rows = {}
    try:
        for case, plan_json in cases.items():
            plan = Plan.from_json(plan_json)
            mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
            torch.manual_seed(1)
            x = torch.randint(0, ARGS.vocab_size, (BATCH, SEQ))
            (placed,) = shard_inputs(x, input_placements(plan), mesh)
            x_local = placed.to_local()  # this rank's rows (replicated on tp)
            torch.manual_seed(0)
            base = _baseline(case, Transformer(ARGS), mesh)
            opt = torch.optim.SGD(base.parameters(), lr=0.01)
            steps = {"base": _sgd_step(base, opt, lambda b=base, x=x_local: _loss(b(x)))}
            row = {}
            _, loss = timed_ms(steps["base"])
            # the wrappers' loss is this rank's rows' mean: the global one is the ranks' mean
            total = torch.tensor([_first_loss(loss)])
            dist.all_reduce(total)
            row["base_loss"] = float(total) / WORLD
            for compiled in (False, True) if compile else (False,):
                torch.manual_seed(0)
                pm = parallelize(Transformer(ARGS), plan, mesh, compile=compiled)
                opt = torch.optim.SGD(pm.parameters(), lr=0.01)
                key = "compiled" if compiled else "eager"
                steps[key] = _sgd_step(pm, opt, lambda p=pm, x=x_local: _loss(p(x)))
                # the first step traces and lowers (and compiles) once
                ms, loss = timed_ms(steps[key])
                row[f"{key}_first_s"] = ms / 1e3
                row[f"{key}_loss"] = _first_loss(loss)
            medians = _interleaved(steps, opts["steps"], opts["warmup"])
            row |= {f"{name}_ms": ms for name, ms in medians.items()}
            rows[case] = row
            if rank == 0:
                print(case, json.dumps(row), flush=True)
        if rank == 0:
            write_text(out, json.dumps(rows))
        # every rank here: a gloo worker thread still finishing a collective of the
        # baselines takes the GIL while this one waits, not at the interpreter's teardown
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--topology",
        help="a topology file (`autoplan calibrate`) or preset to plan with; default: a rough CPU guess",
    )
    args = parser.parse_args()
    names = args.case or list(CASES)
    plans = {}
    for case in names:
        start = time.perf_counter()
        topology = CPU if args.topology is None else load_topology(args.topology)
        plans[case] = _plan(case, topology=topology).to_json()
        print(f"planned {case} in {time.perf_counter() - start:.1f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rows.json"))
        port = free_port()
        opts = {"steps": args.steps, "warmup": args.warmup}
        mp.spawn(_worker, args=(port, plans, opts, args.compile, out), nprocs=WORLD, join=True)
        rows = json.loads(Path(out).read_text())
    # planned with a topology of one's own: a section of its own beside the default's
    write_section(
        args.out, "apply" if args.topology is None else "apply_topology", _report(rows, args)
    )
    print(f"wrote {args.out}")


def _report(rows: dict, args: argparse.Namespace) -> str:
    lines = [
        *header(
            "autoplan.parallelize against PyTorch's wrappers",
            "bench_apply.py",
            platform.machine(),
            f"4 gloo processes, one thread each. Tiny LLaMA (dim {ARGS.dim}, {ARGS.n_layers} "
            f"layers, {ARGS.n_heads} heads, {ARGS.n_kv_heads} kv heads, vocab "
            f"{ARGS.vocab_size}), batch {BATCH} x seq {SEQ}. Median step (forward + backward + "
            f"SGD, the slowest rank) over {args.steps} steps after {args.warmup}, the sides "
            "taking turns step by step; the loss (the mean of the logits) is computed outside "
            "the model on both sides; `parallelize` runs the plan's buckets (25 MiB); *first "
            "call*: the parallelized model's first step (trace, check, lower, and compile when "
            "asked).",
        ),
        "",
        "| case | PyTorch | PyTorch ms | parallelize ms | ratio | first call s |"
        + (" compile=True ms | ratio | first call s |" if args.compile else ""),
        "|---|---|---|---|---|---|" + ("---|---|---|" if args.compile else ""),
    ]
    for case, r in rows.items():
        line = (
            f"| {case} | {CASES[case][3]} | {r['base_ms']:.1f} | {r['eager_ms']:.1f} | "
            f"{r['eager_ms'] / r['base_ms']:.2f} | {r['eager_first_s']:.1f} |"
        )
        if "compiled_ms" in r:
            line += (
                f" {r['compiled_ms']:.1f} | {r['compiled_ms'] / r['base_ms']:.2f} | "
                f"{r['compiled_first_s']:.1f} |"
            )
        lines.append(line)
    lines.append("")
    lines.append(
        "First-step losses (same weights and batch): "
        + ", ".join(f"{c} {r['base_loss']:.6f} / {r['eager_loss']:.6f}" for c, r in rows.items())
        + " (PyTorch / parallelize)."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
