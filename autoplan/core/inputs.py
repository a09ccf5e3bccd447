"""The model's inputs: what ``input_fn`` returns, as flat tensors with their keys, and back.

Input: the value of a user's ``input_fn`` (a tensor, a tuple or list of tensors, or a
dict of keyword tensors such as Hugging Face's ``input_ids=``/``labels=``), or the
arguments of a call to the parallelized model. Output: the tensors in one flat order,
each with its key (its position, or its keyword), and the ``(args, kwargs)`` to call the
model with.

Why: the graph has one placeholder per input tensor, in one order; the plan places each
and records the keys, so a later call (``pm(**batch)``) is matched to the planned
placeholders by keyword whatever its dict order, and a key the plan does not know is
named rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from autoplan.core.errors import PlanError

__all__ = ["InputKey", "call_form", "describe", "flatten_inputs", "label", "match_call"]

InputKey = int | str  # a positional input's index, or a keyword input's name


def label(key: InputKey) -> str:
    """How messages name an input: ``input 0`` or ``input 'labels'``."""
    return f"input {key}" if isinstance(key, int) else f"input {key!r}"


def flatten_inputs(
    value: Any, what: str = "input_fn"
) -> tuple[tuple[InputKey, ...], tuple[torch.Tensor, ...]]:
    """``input_fn()``'s value (or a batch of its form) as (keys, tensors) in one flat order.

    Raises ``ValueError`` naming what is not a tensor and how to pass it; ``what`` names
    where the value came from.
    """
    if isinstance(value, torch.Tensor):
        return (0,), (value,)
    if isinstance(value, (tuple, list)):
        for i, x in enumerate(value):
            _check_tensor(x, i, what)
        return tuple(range(len(value))), tuple(value)
    if isinstance(value, Mapping):
        for k, x in value.items():
            if not isinstance(k, str) or not k.isidentifier():
                raise PlanError(
                    f"{what} has a dict with key {k!r}: keys are the forward's keyword "
                    "argument names (strings such as 'input_ids')."
                )
            _check_tensor(x, k, what)
        return tuple(value), tuple(value.values())
    raise PlanError(
        f"{what} must be a tensor, a tuple of tensors or a dict of keyword tensors, "
        f"got {type(value).__name__}; wrap the model if it takes other arguments."
    )


def _check_tensor(x: Any, key: InputKey, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise PlanError(
            f"{what}: {label(key)} is a {type(x).__name__}, not a tensor: the inputs a "
            "plan places are tensors. Fix other arguments in the model, in a wrapper module "
            "(forward(self, x): return self.model(x, 2.0)) or its config, and leave them "
            f"out of {what}{_as_tensor(x)}."
        )


def _as_tensor(x: Any) -> str:
    if isinstance(x, (bool, int, float)):
        return f"; or pass a tensor, torch.tensor({x!r}), if the forward computes with it"
    return ""


def call_form(
    keys: Sequence[InputKey], tensors: Sequence[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` that call the model with ``tensors`` under ``keys``."""
    args = tuple(x for k, x in zip(keys, tensors, strict=True) if isinstance(k, int))
    kwargs = {k: x for k, x in zip(keys, tensors, strict=True) if isinstance(k, str)}
    return args, kwargs


def match_call(
    keys: Sequence[InputKey], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[Any, ...]:
    """A call's arguments in the planned flat order of ``keys``.

    Raises ``TypeError`` naming a missing or unknown keyword, or the positional count,
    and the form the plan was made with.
    """
    positional = sum(isinstance(k, int) for k in keys)
    named = [k for k in keys if isinstance(k, str)]
    form = _form(positional, named)
    unknown = [k for k in kwargs if k not in named]
    if unknown:
        raise TypeError(
            f"the parallelized model got keyword input {unknown[0]!r}, which the plan does not "
            f"know: it was planned for {form}. Pass those inputs, or plan with an input_fn "
            f"that returns {unknown[0]!r} too."
        )
    missing = [k for k in named if k not in kwargs]
    if missing or len(args) != positional:
        got = _form(len(args), list(kwargs))
        raise TypeError(
            f"the parallelized model was planned for {form} but got {got}; "
            "call it with the inputs input_fn returned when planning."
        )
    it = iter(args)
    return tuple(next(it) if isinstance(k, int) else kwargs[k] for k in keys)


def describe(keys: Sequence[InputKey]) -> str:
    """The inputs under ``keys`` as messages name them: ``2 positional inputs``,
    ``keyword inputs input_ids, labels``."""
    return _form(sum(isinstance(k, int) for k in keys), [k for k in keys if isinstance(k, str)])


def _form(positional: int, named: Sequence[str]) -> str:
    parts = [f"{positional} positional input{'s' if positional != 1 else ''}"] if positional else []
    if named:
        parts.append("keyword inputs " + ", ".join(named))
    return " and ".join(parts) or "no inputs"
