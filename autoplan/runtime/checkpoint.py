"""Checkpoints of a parallelized model: torch's distributed checkpoint, checked on load.

Input: a model (parallelized under any plan, or plain on one device), optionally its
optimizer, and a checkpoint folder. Output: :func:`save` writes them with
``torch.distributed.checkpoint`` (each rank its shards, in torch's own format, readable
without autoplan); :func:`load` reads them back into the model and optimizer as they are
placed now (another plan, or one device) and returns the extra values saved beside them.

Why a wrapper: DCP loads whatever keys the model asks for, so a checkpoint of a larger
model loads into a smaller one without a word, and a missing or resized weight fails
deep inside its planner with a traceback per rank. :func:`load` first compares the
checkpoint's recorded keys and global shapes with the model's and names what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from autoplan.core.errors import PlanError
from autoplan.planner.job import in_fake_group

__all__ = ["CheckpointMismatch", "load", "save"]

_MODEL, _OPTIM, _EXTRA = "model", "optim", "extra"


class CheckpointMismatch(PlanError):
    """A checkpoint that does not fit the model (or optimizer) it is loaded into."""


def save(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    **extra: int | float | torch.Tensor,
) -> None:
    """Save ``model`` (and ``optimizer``'s state) to the folder ``path``; call on every rank.

    ``extra`` holds numbers to resume with (the step, a data position); :func:`load`
    returns them. In a process whose only group is a planning (fake) one, this process
    alone writes: a fake group's collectives move no data.
    """
    state: dict[str, Any] = {_MODEL: get_model_state_dict(model)}
    if optimizer is not None:
        state[_OPTIM] = get_optimizer_state_dict(model, optimizer)
    if extra:
        state[_EXTRA] = {k: torch.as_tensor(v) for k, v in extra.items()}
    dcp.save(state, checkpoint_id=str(path), no_dist=in_fake_group())


def load(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int | float]:
    """Load the checkpoint at ``path`` into ``model`` (and ``optimizer``), as they are placed
    now; return the ``extra`` values :func:`save` was given. Call on every rank.

    Raises :class:`CheckpointMismatch` naming the weights the checkpoint lacks, holds
    beyond the model, or holds in another shape, before anything is loaded.
    """
    saved_meta = _saved(path)
    saved = {k: tuple(m.size) for k, m in saved_meta.items()}
    state: dict[str, Any] = {_MODEL: get_model_state_dict(model)}
    _check(path, saved, _MODEL, state[_MODEL], type(model).__name__)
    if optimizer is not None:
        state[_OPTIM] = get_optimizer_state_dict(model, optimizer)
        if not any(k.startswith(f"{_OPTIM}.") for k in saved):
            raise CheckpointMismatch(
                f"{path}: the checkpoint holds no optimizer state (saved without an optimizer); "
                "load it without one, or save the optimizer too."
            )
    extra_keys = [k.removeprefix(f"{_EXTRA}.") for k in saved if k.startswith(f"{_EXTRA}.")]
    if extra_keys:
        state[_EXTRA] = {
            k: torch.zeros(m.size, dtype=m.properties.dtype)
            for k, m in ((k, saved_meta[f"{_EXTRA}.{k}"]) for k in extra_keys)
        }
    dcp.load(state, checkpoint_id=str(path), no_dist=in_fake_group())
    set_model_state_dict(model, state[_MODEL])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state[_OPTIM])
    return {k: v.item() for k, v in state.get(_EXTRA, {}).items()}


def _saved(path: str | Path) -> dict[str, TensorStorageMetadata]:
    """Every tensor the checkpoint at ``path`` holds, with its global shape and dtype."""
    if not Path(path, ".metadata").is_file():
        raise CheckpointMismatch(
            f"{path}: no checkpoint there (no .metadata file); give the folder autoplan's "
            "checkpoint.save (or torch.distributed.checkpoint.save) wrote."
        )
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return {
        k: m
        for k, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }


def _check(
    path: str | Path,
    saved: Mapping[str, tuple[int, ...]],
    prefix: str,
    wanted: Mapping[str, Any],
    what: str,
) -> None:
    """Compare the model's state dict keys and global shapes with the saved ones."""
    have = {k.removeprefix(f"{prefix}."): s for k, s in saved.items() if k.startswith(f"{prefix}.")}
    want = {k: tuple(v.shape) for k, v in wanted.items() if isinstance(v, torch.Tensor)}
    problems = []
    missing = [k for k in want if k not in have]
    if missing:
        problems.append(f"it lacks {len(missing)} of {what}'s weights ({_few(missing)})")
    extra = [k for k in have if k not in want]
    if extra:
        problems.append(f"it holds {len(extra)} weights {what} does not have ({_few(extra)})")
    resized = [
        f"{k}: saved {have[k]}, model {want[k]}" for k in want if k in have and have[k] != want[k]
    ]
    if resized:
        problems.append(f"{len(resized)} weights have another shape ({_few(resized)})")
    if problems:
        raise CheckpointMismatch(
            f"{path} was saved from another model: {'; '.join(problems)}. Build the model the "
            "checkpoint was saved from (same class and dimensions); the plan may differ."
        )


def _few(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")
