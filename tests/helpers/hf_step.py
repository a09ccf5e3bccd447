"""A Hugging Face training step as a job runs it, ending the way jobs end; for tests/integration/test_exit.py.

Run: ``torchrun --nproc-per-node 4 tests/helpers/hf_step.py``

A tiny Qwen2 built from its config, planned inside the job on a 2x2 (dp, tp) mesh with a
``loss_fn``, parallelized with it; one forward and backward, ``autoplan.full_gradients``,
then ``destroy_process_group()`` and a normal interpreter exit: the sequence that some
runs ended in SIGABRT at exit ("terminate called without an active exception",
autoplan.runtime.release). Rank 0 prints the loss and how many gradients it gathered.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan.models import hf
from autoplan.runtime.apply import full_gradients, parallelize, shard_inputs

CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
BATCH, SEQ = 8, 16


def square_loss(logits: torch.Tensor) -> torch.Tensor:
    """The loss planned and run inside the step."""
    return logits.float().square().mean()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = autoplan.plan(
        hf.build_hf("qwen2", CONFIG),
        lambda: torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ)),
        mesh,
        input_placements=["S(0)R"],
        loss_fn=square_loss,
        broadcast_from=0,
    )
    torch.manual_seed(0)
    pm = parallelize(hf.build_hf("qwen2", CONFIG, device="cpu"), plan, mesh, loss_fn=square_loss)
    tokens = torch.randint(
        0, CONFIG["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1)
    )
    (x,) = shard_inputs(tokens, plan, mesh)
    loss = pm(x)
    loss.backward()
    grads = full_gradients(pm)
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.6f} gradients {len(grads)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
