"""Plan a tiny LLaMA on a 2x2 (dp, tp) mesh inside the job, apply the plan on gloo, train
5 SGD steps.

Run: ``torchrun --nproc-per-node 4 examples/train_tiny.py``

Every rank builds the job's mesh and calls ``autoplan.plan`` on it with
``broadcast_from=0``: rank 0 plans (on fake tensors, no collective) and every rank
receives its plan. Rank 0 also trains a single-device copy of the model on the same
batches and prints, per step, the parallel loss and its difference from the
single-device loss.

The parallelized model runs the planned forward program and returns the logits as a
DTensor in the plan's output placement; the cross-entropy on them (labels placed like
the tokens) is computed outside, as any loss would be, and its ``backward()`` runs the
planned backward program. Each step also counts the collectives the two programs ran
and prints them beside the ones the plan priced.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

import autoplan
from autoplan.models.llama3 import Transformer, tiny
from autoplan.result.plan import Plan
from autoplan.runtime.apply import parallelize, shard_inputs
from autoplan.runtime.execute import collective_counts
from autoplan.runtime.lower import CommCounter

MESH_SHAPE, AXES, INPUT_PLACEMENT = (2, 2), ("dp", "tp"), "S(0)R"
STEPS, LR, BATCH, SEQ = 5, 0.5, 8, 16
MEMORY_BUDGET_GIB = 0.0006  # below the 1.75 MiB of a replicated model: the plan must shard


def make_plan(mesh) -> Plan:
    """Plan on the job's mesh: rank 0 plans, every rank gets the plan."""
    with torch.device("meta"):
        model = Transformer(tiny(2))
    return autoplan.plan(
        model,
        lambda: torch.randint(0, 128, (BATCH, SEQ)),
        mesh,
        input_placements=[INPUT_PLACEMENT],
        # CBC (the default) plans this budgeted ILP, and again with its buckets' launches
        # shared (the bucket search), in about 6.5 s here (2 cores).
        config=autoplan.PlanConfig(memory_budget_gib=MEMORY_BUDGET_GIB),
        broadcast_from=0,
    )


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token-style cross-entropy over every position (batch and sequence flattened)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def main() -> None:
    torch.set_num_threads(1)
    # CommCounter's module tracker (CommDebugMode's) warns about a module (the planned
    # one) whose forward runs no submodules; the counts it keeps are unaffected.
    warnings.filterwarnings("ignore", message="The module hierarchy tracking")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=AXES)
    plan = make_plan(mesh)
    if rank == 0:
        print(plan.summary(), flush=True)

    torch.manual_seed(0)
    model = Transformer(tiny(2))
    model.init_weights(seed=0)
    ref = copy.deepcopy(model) if rank == 0 else None
    model = parallelize(model, plan, mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR) if ref is not None else None

    data = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        tokens = torch.randint(0, 128, (BATCH, SEQ), generator=data)  # same batch on every rank
        labels = torch.randint(0, 128, (BATCH, SEQ), generator=data)
        (sharded,) = shard_inputs(tokens, [INPUT_PLACEMENT], mesh)
        # every rank holds the whole batch's labels: replicated, DTensor slices them locally
        # to wherever the plan put the logits (no communication)
        placed_labels = DTensor.from_local(labels, mesh, [Replicate()] * mesh.ndim)
        with CommCounter() as comm:
            logits = model(sharded.to_local())  # each rank passes its local shard
            counted = Counter(comm.get_comm_counts())  # the forward program's collectives
        # the loss on the logits DTensor, as a plain replicated tensor: DTensor reduces it
        # (its own collectives, outside the plan's and not counted)
        loss = cross_entropy(logits, placed_labels).full_tensor()
        with CommCounter() as comm:
            loss.backward()
            # every kind of either program: the backward runs kinds the forward does not
            counted += Counter(comm.get_comm_counts())
        opt.step()
        opt.zero_grad()
        if ref is not None:
            ref_loss = cross_entropy(ref(tokens), labels)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            ran = collective_counts(counted)
            print(
                f"step {step}  loss {loss.item():+.8f}  one device {ref_loss.item():+.8f}  "
                f"diff {abs(loss.item() - ref_loss.item()):.2e}  collectives {ran}",
                flush=True,
            )
    if rank == 0:
        print("priced by the plan:", plan.collective_counts())  # buckets merged as it lists
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
