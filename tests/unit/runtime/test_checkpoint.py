"""Checkpoints of a parallelized model in one process: DCP's save and load give back weights,
optimizer state and step; a checkpoint of another model, or a missing one, is refused by
name; a meta model with non-persistent buffers needs ``init_fn``. The 4-process job
(weights broadcast, training, resuming under another plan) is in
tests/integration/test_checkpoint.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
)

import autoplan
from autoplan.models.llama3 import Transformer, tiny
from autoplan.runtime.apply import parallelize
from tests.helpers.checkpointing import BATCH, LR, SEQ, VOCAB, batch, cross_entropy, max_diff


def test_a_meta_model_with_buffers_no_state_dict_holds_needs_init_fn():
    """The RoPE tables are non-persistent: loading weights would leave them garbage."""
    mesh = autoplan.fake_mesh((4,), ("dp",))
    with torch.device("meta"):
        model = Transformer(tiny(1))
    plan = autoplan.plan(model, lambda: torch.randint(0, VOCAB, (BATCH, SEQ)), mesh)
    with pytest.raises(
        ValueError, match=r"non-persistent buffers \(freqs_cos, freqs_sin\).*init_fn="
    ):
        parallelize(model, plan, mesh)
    pm = parallelize(model, plan, mesh, init_fn=Transformer.init_buffers)
    assert torch.equal(pm.freqs_cos.to_local(), Transformer(tiny(1)).freqs_cos)  # replicated


def _saved(tmp_path, n_layers: int = 2):
    torch.manual_seed(0)
    model = Transformer(tiny(n_layers))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens, labels = batch(0)
    cross_entropy(model(tokens), labels).backward()
    opt.step()
    folder = tmp_path / "ckpt"
    autoplan.runtime.checkpoint.save(folder, model, opt, step=7)
    return folder, model, opt


def test_checkpoint_save_and_load_give_back_weights_optimizer_and_step(tmp_path):
    """One process, no plan: the wrapper round-trips weights, AdamW state and its extras."""
    folder, model, opt = _saved(tmp_path)
    again = Transformer(tiny(2))
    again_opt = torch.optim.AdamW(again.parameters(), lr=LR)
    assert autoplan.runtime.checkpoint.load(folder, again, again_opt) == {"step": 7}
    assert max_diff(again.state_dict(), model.state_dict()) == 0.0
    assert (
        max_diff(
            get_optimizer_state_dict(again, again_opt)["state"]["output.weight"],
            get_optimizer_state_dict(model, opt)["state"]["output.weight"],
        )
        == 0.0
    )


@pytest.mark.parametrize(
    "other, message",
    [
        # DCP alone loads this one without a word: the checkpoint's second layer is dropped
        (lambda: Transformer(tiny(1)), r"holds 9 weights Transformer does not have \(layers\.1\."),
        (lambda: Transformer(tiny(3)), r"lacks 9 of Transformer's weights \(layers\.2\."),
        (
            lambda: Transformer(dataclasses.replace(tiny(2), dim=128)),
            r"tok_embeddings\.weight: saved \(128, 64\), model \(128, 128\)",
        ),
    ],
)
def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path, other, message):
    folder, *_ = _saved(tmp_path)
    model = other()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(autoplan.runtime.checkpoint.CheckpointMismatch, match=message):
        autoplan.runtime.checkpoint.load(folder, model)
    assert max_diff(model.state_dict(), before) == 0.0  # nothing loaded


def test_a_missing_checkpoint_or_optimizer_state_is_named(tmp_path):
    with pytest.raises(
        autoplan.runtime.checkpoint.CheckpointMismatch, match=r"no checkpoint there"
    ):
        autoplan.runtime.checkpoint.load(tmp_path / "nowhere", Transformer(tiny(2)))
    model = Transformer(tiny(2))
    autoplan.runtime.checkpoint.save(tmp_path / "weights", model)
    with pytest.raises(
        autoplan.runtime.checkpoint.CheckpointMismatch, match=r"holds no optimizer state"
    ):
        autoplan.runtime.checkpoint.load(
            tmp_path / "weights", model, torch.optim.AdamW(model.parameters())
        )
