"""Plan LLaMA3-8B (2 layers) on a fake 8x8 (dp, tp) mesh from Python; prints the plan.

python examples/plan_llama3.py
"""

import torch
from torch.distributed.tensor import Replicate, Shard

import autoplan
from autoplan.models.llama3 import ModelArgs, Transformer

mesh = autoplan.fake_mesh((8, 8), ("dp", "tp"))  # fake process group of 64 ranks on one CPU
with torch.device("meta"):
    model = Transformer(
        ModelArgs(dim=4096, n_layers=2, n_heads=32, n_kv_heads=8, vocab_size=128256,
                  ffn_dim_multiplier=1.3, multiple_of=1024, rope_theta=500000.0, max_seq_len=8192)
    )  # fmt: skip
plan = autoplan.plan(
    model,
    lambda: torch.randint(0, 128256, (16, 8192)),
    mesh,
    config=autoplan.PlanConfig(memory_budget_gib=4.0),
    input_placements=[(Shard(0), Replicate())],
)
print(plan.summary())
plan.save("llama3_8b_2l.plan.json")
