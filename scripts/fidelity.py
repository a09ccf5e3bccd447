"""Estimated against measured step times: does the cost model price and rank plans as the
machine that runs them does?

For three models (the tiny LLaMA of ``scripts/bench_apply.py``, a Hugging Face Qwen2
built from its config, a residual MLP) and ten candidate plans each, planned on a fake
mesh with the topology given (a calibrated file, ``autoplan calibrate``), then run with
``autoplan.parallelize`` on 4 processes:

- ``ddp``: every parameter ``R`` on dp=4;
- ``fsdp``: every parameter ``S(0)`` on dp=4;
- ``tp``: torchtitan's layout on (dp=2, tp=2): the attention's and feed-forward's input
  projections colwise ``S(0)`` on tp, the output projections rowwise ``S(1)``, all
  ``S(0)`` on dp;
- ``free-4``: the planner's own choice on dp=4;
- ``free``, ``free-b1``, ``free-b2``: the planner's own choice on (dp=2, tp=2), with no
  budget, then under two budgets that count activations, checkpointing ``auto``: halfway
  from the free plan's footprint (parameters, gradients, optimizer state, activations)
  down to the FSDP plan's, and the FSDP plan's;
- ``pins-0``..``pins-2``: each parameter pinned to a random placement on (dp=2, tp=2).

A step is ``loss = model(x); loss.backward()`` with the loss planned inside the model
(``loss_fn``), which is what a plan's estimate covers; the optimizer's update is not
timed. Each candidate's figure is the median over ``--steps`` steps, the slowest rank's
time, measured in ``--rounds`` rounds in which the candidates take turns: each is built,
warmed up for ``--warmup`` steps, timed and freed before the next, so that it runs alone
in the processes, as a training job's plan does (beside the other candidates' state the
plans ran slower, FSDP's most: benchmarks/NOTES.md). The table gives each
plan's estimate (``Plan.estimated_step_us``: the objective with its buckets), the
measured step and the error; per model, Spearman's rank correlation over the candidates
and where the planner's pick (the cheaper estimate of ``free-4`` and ``free``: the plan
it would choose given both meshes; on a tie the smaller mesh) lands among the measured.
Candidates whose plans run the same program (the same mesh, placements, routes, buckets,
checkpointing and settings: the planner's free choice is often DDP's plan itself) are
measured once and share the figures: two measurements of one program differ only by the
machine's noise. Writes its section of
benchmarks/RESULTS.md and a scatter plot (estimated vs measured, the diagonal drawn).

    torchrun --nproc-per-node 4 --no-python autoplan calibrate --mesh 2x2 --names dp,tp --out cpu.yaml
    python scripts/fidelity.py --topology cpu.yaml [--steps 16] [--rounds 4] [--warmup 2] [--model llama ...] [--skip free-b1 ...]
    python scripts/fidelity.py --topology h100 --device cuda   # on a machine with 4 GPUs
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fidelity_report import plot, report  # scripts/fidelity_report.py
from gloo_steps import KEEP_FREED, free_port, layout_pins, timed_ms, worker_env  # scripts/
from results_md import RESULTS, ROOT, write_section  # scripts/results_md.py
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.core.errors import PlanError
from autoplan.models import hf
from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.models.mlp import TinyMLP
from autoplan.result.plan import Plan
from autoplan.runtime.apply import parallelize, shard_inputs
from autoplan.tools.runfile import load_topology

WORLD = 4
BATCH, SEQ = 8, 128
LLAMA = ModelArgs(
    dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=1024, multiple_of=64, max_seq_len=SEQ
)
QWEN2 = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": SEQ,
}
MLP = {"dim": 512, "hidden": 2048, "n_layers": 4}
MLP_ROWS = 1024
# Per model: its colwise (input projections) and rowwise (output projections) modules.
LAYOUT = {
    "llama": (
        ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"),
        ("attention.wo", "feed_forward.w2"),
    ),
    "hf": (
        ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"),
        ("o_proj", "down_proj"),
    ),
    "mlp": (("w1",), ("w2",)),
}
MODELS = tuple(LAYOUT)
# the fields of a plan that ``parallelize`` runs; the rest are estimates and diagnostics
PROGRAM = (
    "mesh_shape", "axis_names", "param_placements", "node_placements", "routes", "buckets",
    "checkpointing", "recompute", "config", "input_shapes", "input_keys", "loss_fn",
    "param_shapes", "graph_fingerprint",
)  # fmt: skip
FLAT, GRID = ((WORLD,), ("dp",)), ((2, 2), ("dp", "tp"))


def square_loss(out: torch.Tensor) -> torch.Tensor:
    """The loss planned inside every model: the mean of the squared output."""
    return out.float().square().mean()


def build(model: str, device: str = "meta") -> torch.nn.Module:
    """``model`` on ``device`` (real weights from seed 0 off the meta device)."""
    torch.manual_seed(0)
    if model == "hf":
        return hf.build_hf("qwen2", QWEN2, device=device)
    with torch.device(device):
        m = Transformer(LLAMA) if model == "llama" else TinyMLP(**MLP)
    if device != "meta":
        m.init_weights(seed=0)
    return m


def example(model: str, device: str = "cpu") -> torch.Tensor:
    """The global batch, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    if model == "mlp":
        return torch.randn(MLP_ROWS, MLP["dim"], generator=g).to(device)
    vocab = LLAMA.vocab_size if model == "llama" else QWEN2["vocab_size"]
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g).to(device)


def _random_pins(params: dict[str, torch.Size], seed: int) -> dict[str, str]:
    """Each parameter on each axis of (2, 2): replicated or sharded on a dim it divides
    into, drawn with ``seed``."""
    rng = random.Random(seed)
    out = {}
    for fqn, shape in params.items():
        per_axis = []
        sharded = [1] * len(shape)
        for _ in range(2):
            dims = [d for d in range(len(shape)) if shape[d] % (sharded[d] * 2) == 0]
            d = rng.choice([None, *dims])
            if d is not None:
                sharded[d] *= 2
            per_axis.append("R" if d is None else f"S({d})")
        out[fqn] = "".join(per_axis)
    return out


def candidates(model: str) -> list[tuple[str, tuple, dict[str, str], float | None]]:
    """(name, (mesh shape, names), pins, budget GiB or None: filled in after ``free``)."""
    params = {n: p.shape for n, p in build(model).named_parameters()}
    out = [
        ("ddp", FLAT, dict.fromkeys(params, "R"), None),
        ("fsdp", FLAT, dict.fromkeys(params, "S(0)"), None),
        ("tp", GRID, layout_pins(params, *LAYOUT[model]), None),
        ("free-4", FLAT, {}, None),
        ("free", GRID, {}, None),
        ("free-b1", GRID, {}, 0.5),
        ("free-b2", GRID, {}, 0.0),
    ]
    out += [(f"pins-{k}", GRID, _random_pins(params, seed=k), None) for k in range(3)]
    return out


def _plan_one(model: str, mesh: tuple, pins: dict, budget_gib: float | None, topology) -> Plan:
    shape, names = mesh
    placement = "S(0)" if len(shape) == 1 else "S(0)R"
    config = autoplan.PlanConfig(topology=topology)
    if budget_gib is not None:
        config = autoplan.PlanConfig(
            topology=topology,
            memory_budget_gib=budget_gib,
            activation_memory=True,
            activation_checkpointing="auto",
        )
    x = example(model, "cpu")
    return autoplan.plan(
        build(model),
        lambda: x,
        autoplan.fake_mesh(shape, names),
        config=config,
        input_placements=[placement],
        pins=pins,
        loss_fn=square_loss,
    )


def _footprint(plan: Plan) -> float:
    """What a budget that counts activations caps, in bytes."""
    kept = ("parameters", "gradients", "optimizer", "activations", "output_grad")
    return sum(plan.memory_breakdown[k] for k in kept)


def plan_all(model: str, topology, skip: frozenset[str] = frozenset()) -> dict[str, Plan]:
    """Every candidate's plan but those in ``skip``; a budgeted one's budget lies
    ``share`` of the way from the FSDP plan's footprint up to the free plan's."""
    plans: dict[str, Plan] = {}
    for name, mesh, pins, share in candidates(model):
        if name in skip:
            continue
        budget = None
        if share is not None:
            low, high = _footprint(plans["fsdp"]), _footprint(plans["free"])
            budget = (low + share * max(0.0, high - low)) / 2**30
        start = time.perf_counter()
        try:
            plans[name] = _plan_one(model, mesh, pins, budget, topology)
        except PlanError as e:  # a budget or a pin no plan meets: said, not hidden
            print(f"  {model} {name}: no plan ({e})", file=sys.stderr, flush=True)
            continue
        p = plans[name]
        if p.status == "infeasible":
            print(f"  {model} {name}: {p.message}", file=sys.stderr, flush=True)
            del plans[name]
            continue
        print(
            f"  {model} {name}: planned in {time.perf_counter() - start:.1f} s, "
            f"estimated {p.estimated_step_us / 1e3:.2f} ms ({p.status})",
            file=sys.stderr,
            flush=True,
        )
    return plans


def same_program(plans: dict[str, Plan]) -> dict[str, str]:
    """Each candidate's first candidate (in ``plans``' order) whose plan runs the same
    program, itself when none before it does."""
    first: dict[str, str] = {}
    out = {}
    for name, plan in plans.items():
        fields = json.loads(plan.to_json())
        key = json.dumps({k: fields[k] for k in PROGRAM}, sort_keys=True)
        out[name] = first.setdefault(key, name)
    return out


def _worker(rank: int, port: int, work: dict, opts: dict, out: str) -> None:
    device = opts["device"]
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=900),
    )
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        meshes = {
            mesh: init_device_mesh(device, mesh[0], mesh_dim_names=mesh[1]) for mesh in (FLAT, GRID)
        }
        for model, plans in work.items():
            rows[model] = _measure(model, plans, meshes, opts)
            if rank == 0:
                print(f"  {model}: measured {len(plans)} plans", file=sys.stderr, flush=True)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _built(model: str, text: str, meshes: dict, device: str) -> Callable[[], None]:
    """One training step of plan ``text`` (forward and backward, gradients reset)."""
    plan = Plan.from_json(text)
    mesh = meshes[(plan.mesh_shape, plan.axis_names)]
    pm = parallelize(build(model, device), plan, mesh, loss_fn=square_loss)
    (x,) = shard_inputs(example(model, device), plan, mesh)

    def step() -> None:
        pm.zero_grad(set_to_none=True)
        pm(x).backward()

    return step


def _measure(model: str, plans: dict[str, str], meshes: dict, opts: dict) -> dict[str, list[float]]:
    """Each plan's measured steps: ``rounds`` rounds in which the plans take turns, each
    built, warmed up, timed and freed before the next, so that a plan runs with its own
    state alone in the processes, as a training job does."""
    times: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(opts["rounds"]):
        for name, text in plans.items():
            step = _built(model, text, meshes, opts["device"])
            for i in range(opts["warmup"] + opts["steps"] // opts["rounds"]):
                ms, _ = timed_ms(step, opts["device"])
                if i >= opts["warmup"]:
                    times[name].append(ms)
            del step
            gc.collect()  # the plan's modules and buffers go before the next is built
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help="calibrated YAML or a preset name")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model", action="append", choices=MODELS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--skip", action="append", default=[], metavar="PLAN",
        help="leave a candidate out (e.g. free-b1, whose budgeted plan takes minutes)",
    )  # fmt: skip
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--plot", default=str(ROOT / "benchmarks" / "fidelity.png"))
    args = parser.parse_args()
    if args.steps < 8:
        parser.error(f"--steps {args.steps}: at least 8 steps make a median")
    if args.rounds < 1 or args.steps % args.rounds:
        parser.error(f"--rounds {args.rounds}: give a divisor of --steps ({args.steps})")
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        parser.error(
            f"--device cuda needs {WORLD} GPUs; this machine has {torch.cuda.device_count()}"
        )
    topology = load_topology(args.topology)
    models = args.model or list(MODELS)
    names = {c[0] for c in candidates(models[0])}
    unknown = sorted(set(args.skip) - names)
    if unknown:
        parser.error(
            f"--skip {unknown[0]}: not a candidate; choose from {', '.join(sorted(names))}"
        )
    if {"fsdp", "free"} & set(args.skip) and {"free-b1", "free-b2"} - set(args.skip):
        parser.error(
            "--skip fsdp or free needs --skip free-b1 and free-b2 (their budgets use both)"
        )
    plans = {}
    for model in models:
        print(f"planning {model}", file=sys.stderr, flush=True)
        plans[model] = plan_all(model, topology, frozenset(args.skip))
    same = {m: same_program(ps) for m, ps in plans.items()}
    work = {
        m: {n: p.to_json() for n, p in ps.items() if same[m][n] == n} for m, ps in plans.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rows.json"))
        opts = {
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "device": args.device,
        }
        with worker_env(KEEP_FREED if args.device == "cpu" else {}):
            mp.spawn(_worker, args=(free_port(), work, opts, out), nprocs=WORLD, join=True)
        measured = json.loads(Path(out).read_text())
    rows = {m: {n: measured[m][same[m][n]] for n in plans[m]} for m in measured}
    medians = {m: {n: statistics.median(t) for n, t in times.items()} for m, times in rows.items()}
    points = {
        m: [(ms[n], plans[m][n].estimated_step_us / 1e3) for n in ms] for m, ms in medians.items()
    }
    plot(points, Path(args.plot))
    text = report(plans, rows, same, args, args.topology, WORLD)
    write_section(args.out, "fidelity", text)
    print(text)


if __name__ == "__main__":
    main()
