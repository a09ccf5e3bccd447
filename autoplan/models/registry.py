"""The model kinds a run file can name: each one's arguments, builder, inputs and limits.

Input: a run file's ``model`` section, as a kind's name (``llama3``, ``moe``, ``mlp``, or
``hf:<kind>`` for a Hugging Face causal LM) and its arguments. Output: a
:class:`ModelKind`, which checks the arguments (unknown keys named with the allowed
ones), builds the model on the meta device, makes its global example inputs and says the
longest sequence it takes.

Why a registry: the run file reader, the CLI and the scripts ask every model the same
questions; one entry per kind answers them, so a new model is one entry, not another
branch in each reader.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.models import hf
from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.models.mlp import MLPArgs, TinyMLP
from autoplan.models.moe import MoEArgs, MoETransformer

__all__ = ["REFERENCE", "ModelKind", "model_kind"]

InputFn = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class ModelKind:
    """One kind of model. ``keys`` are the argument names it takes; ``check`` raises a
    PlanError (``ValueError`` or ``TypeError`` from the model's own checks are turned into
    one) for arguments it cannot be built with; ``build`` makes it on the meta device;
    ``inputs(args, batch, seq)`` the global example inputs; ``seq_limit(args)`` the
    longest sequence, what bounds it and the run file key that sets it, or None."""

    name: str
    keys: Callable[[], tuple[str, ...]]
    check: Callable[[Mapping[str, Any]], None]
    build: Callable[[Mapping[str, Any]], nn.Module]
    inputs: Callable[[Mapping[str, Any], int, int], InputFn]
    seq_limit: Callable[[Mapping[str, Any]], tuple[int, str, str] | None]


def _tokens(vocab: int, batch: int, seq: int) -> InputFn:
    return lambda: torch.randint(0, vocab, (batch, seq))


def _features(dim: int, batch: int, seq: int) -> InputFn:
    return lambda: torch.randn(batch, seq, dim)


def _fields(cls: type) -> Callable[[], tuple[str, ...]]:
    return lambda: tuple(f.name for f in dataclasses.fields(cls))


def _checked(make: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], None]:
    def check(args: Mapping[str, Any]) -> None:
        try:
            make(args)
        except PlanError:
            raise
        except (TypeError, ValueError) as exc:
            raise PlanError(str(exc)) from exc

    return check


def _on_meta(make: Callable[[Mapping[str, Any]], nn.Module]) -> Callable[..., nn.Module]:
    def build(args: Mapping[str, Any]) -> nn.Module:
        with torch.device("meta"):
            return make(args)

    return build


def _decoder_kind(name: str, args_cls: type, model_cls: Callable[[Any], nn.Module]) -> ModelKind:
    """A reference decoder's kind: token inputs, the rotary table bounds the sequence."""

    def limit(args: Mapping[str, Any]) -> tuple[int, str, str]:
        return args_cls(**args).max_seq_len, "the model's rotary table", "model.args.max_seq_len"

    return ModelKind(
        name,
        _fields(args_cls),
        _checked(lambda a: args_cls(**a)),
        _on_meta(lambda a: model_cls(args_cls(**a))),
        lambda a, batch, seq: _tokens(args_cls(**a).vocab_size, batch, seq),
        limit,
    )


REFERENCE: dict[str, ModelKind] = {
    "llama3": _decoder_kind("llama3", ModelArgs, Transformer),
    "moe": _decoder_kind("moe", MoEArgs, MoETransformer),
    "mlp": ModelKind(
        "mlp",
        _fields(MLPArgs),
        _checked(lambda a: TinyMLP.from_args(MLPArgs(**a))),
        _on_meta(lambda a: TinyMLP.from_args(MLPArgs(**a))),
        lambda a, batch, seq: _features(MLPArgs(**a).dim, batch, seq),
        lambda a: None,
    ),
}


@functools.cache
def _hf_kind(kind: str) -> ModelKind:
    def check(args: Mapping[str, Any]) -> None:
        hf.make_config(kind, dict(args))

    def limit(args: Mapping[str, Any]) -> tuple[int, str, str] | None:
        found = hf.position_limit(kind, hf.make_config(kind, dict(args)))
        if found is None:
            return None
        return found, "the model's learned position table", "model.config.n_positions"

    return ModelKind(
        f"hf:{kind}",
        lambda: hf.config_keys(kind),
        check,
        lambda a: hf.build_hf(kind, dict(a)),
        lambda a, batch, seq: _tokens(hf.make_config(kind, dict(a)).vocab_size, batch, seq),
        limit,
    )


def model_kind(name: str) -> ModelKind:
    """The kind called ``name`` (``llama3``, ``moe``, ``mlp`` or ``hf:<kind>``); a PlanError naming
    the allowed ones for any other."""
    if name in REFERENCE:
        return REFERENCE[name]
    if name.startswith("hf:") and name.removeprefix("hf:") in hf.KINDS:
        return _hf_kind(name.removeprefix("hf:"))
    allowed = ", ".join([*REFERENCE, *(f"hf:{k}" for k in hf.KINDS)])
    raise PlanError(f"model {name!r} is not known; allowed: {allowed}")
