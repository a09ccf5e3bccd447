"""Train a tiny LLaMA as a byte-level language model, planned inside the ``torchrun`` job.

Run:    ``torchrun --nproc-per-node 4 examples/train_lm.py``
Resume: ``torchrun --nproc-per-node 4 examples/train_lm.py --resume --memory-budget-gib 0.001``

The text is the Python Language Reference that CPython ships with its standard library
(``pydoc_data.topics``, the pages ``help()`` shows): real English, no download. Each
batch is ``--batch`` windows of ``--seq`` bytes at offsets drawn from the step number,
so a resumed run reads the same batches; the labels are the next bytes, computed here,
outside the model, and the loss is the cross-entropy of the returned logits on them.

What a training script does, in order: every rank builds the job's 2x2 (dp, tp) mesh and
plans on it in-process (fake tensors, no collective: every rank gets the same plan);
the model is built on the meta device, parallelized (each rank allocates its shards
only) and gets its weights from rank 0's full state dict; AdamW with a linear
learning-rate warm-up trains it. At ``--checkpoint-at`` the model and AdamW state are
saved (``autoplan.checkpoint``: torch's distributed checkpoint, each rank its shards);
``--resume`` loads them into a model
planned again, under ``--memory-budget-gib`` if given (other placements), and goes on
from there with the same losses as the run that was not interrupted. Rank 0 also trains
a one-device copy for the first ``--compare-steps`` steps and prints the difference.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from pydoc_data.topics import topics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

import autoplan
from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.runtime.apply import parallelize, shard_inputs

MESH_SHAPE, AXES, INPUT_PLACEMENT = (2, 2), ("dp", "tp"), "S(0)R"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=120, help="steps in all (default 120)")
    p.add_argument("--checkpoint-at", type=int, default=60, help="save after this many steps")
    p.add_argument("--checkpoint-dir", default="train_lm.ckpt", help="where to save")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint")
    p.add_argument("--memory-budget-gib", type=float, default=None, help="plan under a budget")
    p.add_argument("--compare-steps", type=int, default=5, help="steps rank 0 checks")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20, help="steps of linear warm-up")
    args = p.parse_args()
    if not 0 < args.checkpoint_at <= args.steps:
        p.error(f"--checkpoint-at {args.checkpoint_at} must be within 1..--steps ({args.steps})")
    return args


def model_args(seq: int) -> ModelArgs:
    """A 2-layer LLaMA over the 256 byte values."""
    return ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32,
        max_seq_len=seq,
    )  # fmt: skip


def corpus() -> torch.Tensor:
    """The Language Reference's pages as one byte sequence (int64 token ids)."""
    text = "\n\n".join(topics[name] for name in sorted(topics)).encode()
    return torch.tensor(list(text), dtype=torch.int64)


def batch(text: torch.Tensor, step: int, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` windows of ``seq`` bytes and their next bytes; the same for the same step."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(text) - seq - 1, (size,), generator=g)
    windows = torch.stack([text[s : s + seq + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def lr_at(step: int, args: argparse.Namespace) -> float:
    return args.lr * min(1.0, (step + 1) / args.warmup)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def make_plan(mesh, args: argparse.Namespace) -> autoplan.Plan:
    """Plan on the job's mesh, on this rank (deterministic: every rank gets this plan)."""
    with torch.device("meta"):
        model = Transformer(model_args(args.seq))
    return autoplan.plan(
        model,
        lambda: torch.randint(0, 256, (args.batch, args.seq)),
        mesh,
        input_placements=INPUT_PLACEMENT,
        config=autoplan.PlanConfig(memory_budget_gib=args.memory_budget_gib),
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=AXES)
    plan = make_plan(mesh, args)
    placed = sorted({autoplan.core.placements.fmt(p) for p in plan.param_placements.values()})
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"plan: {plan.status}, parameter placements {placed}", flush=True)

    # The one-device model: rank 0's weights are the source of every rank's shards.
    ref = Transformer(model_args(args.seq)) if rank == 0 else None
    if ref is not None:
        ref.init_weights(seed=0)
    with torch.device("meta"):
        model = Transformer(model_args(args.seq))
    model = parallelize(model, plan, mesh, init_fn=Transformer.init_buffers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    start = 0
    if args.resume:  # refuses, by name, a checkpoint of another model
        start = int(autoplan.checkpoint.load(args.checkpoint_dir, model, opt)["step"])
        say(f"resumed at step {start} from {args.checkpoint_dir}", flush=True)
    else:
        full = ref.state_dict() if ref is not None else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full, options=options)
    compare = ref is not None and not args.resume
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.1) if compare else None

    text = corpus()
    replicated = [Replicate()] * mesh.ndim
    for step in range(start, args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        tokens, labels = batch(text, step, args.batch, args.seq)
        (x,) = shard_inputs(tokens, plan, mesh)
        # every rank holds the whole batch's labels; DTensor slices them to the logits' shards
        loss = cross_entropy(model(x.to_local()), DTensor.from_local(labels, mesh, replicated))
        loss = loss.full_tensor()
        loss.backward()
        opt.step()
        opt.zero_grad()
        line = f"step {step:4d}  loss {loss.item():.6f}  lr {lr_at(step, args):.2e}"
        if compare and step < args.compare_steps:
            for group in ref_opt.param_groups:
                group["lr"] = lr_at(step, args)
            ref_loss = cross_entropy(ref(tokens), labels)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            line += (
                f"  one device {ref_loss.item():.6f}  diff {abs(loss.item() - ref_loss.item()):.1e}"
            )
        say(line, flush=True)
        if not args.resume and step + 1 == args.checkpoint_at:
            autoplan.checkpoint.save(args.checkpoint_dir, model, opt, step=step + 1)
            say(f"saved step {step + 1} to {Path(args.checkpoint_dir).resolve()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
