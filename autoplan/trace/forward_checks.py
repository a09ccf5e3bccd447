"""Checks of what the traced forward receives and returns, each failing with a fix.

Input: ``input_fn`` and ``loss_fn`` (called here), the forward's signature and input
keys, its output, and an exception it raised while traced. Output: the value called
for, or a :class:`~autoplan.core.errors.PlanError` naming the input, output or op, where in
the user's code it happened, what autoplan accepts and how to get there.

Why: the trace runs the user's code on fake tensors (shapes, no values), so a mistake
there (a keyword-only argument passed by position, a shape mismatch, ``torch.nonzero``)
surfaces as a torch exception from deep in the fake mode; :mod:`autoplan.trace.capture` calls
these at the point each can first be seen, and chains the original.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.core.inputs import InputKey, call_form, describe, label
from autoplan.core.torch_adapter import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_DATA_DEPENDENT = (DynamicOutputShapeException, DataDependentOutputException)


# A module whose name says it routes tokens to experts (its message names the capacity form)
_EXPERTS = re.compile(r"expert|moe|router|sparse", re.IGNORECASE)
# What a user wrote to call each data-dependent op, for the message.
_WRITTEN_AS = {
    "aten.nonzero": "torch.nonzero, or boolean-mask indexing x[mask]",
    "aten.masked_select": "torch.masked_select, or boolean-mask indexing x[mask]",
    "aten._local_scalar_dense": "a tensor read as a Python number: .item(), int(t), float(t), "
    "or `if t:`",
    "aten.unique": "torch.unique",
    "aten._unique2": "torch.unique",
    "aten.unique_consecutive": "torch.unique_consecutive",
    "aten.repeat_interleave": "torch.repeat_interleave with tensor repeats",
}


_LIBRARIES = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (torch, contextlib)  # torch, and the standard library's context managers
    if m.__file__
) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def call_input_fn(input_fn: Callable[[], Any]) -> Any:
    """``input_fn()``, an exception it raises named as input_fn's."""
    try:
        return input_fn()
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(
            f"input_fn raised {type(exc).__name__}{_at(exc)}: {_first_line(exc)}. It is called "
            "with no arguments under a fake tensor mode (tensors have shapes, no values): "
            "build the inputs with torch.randn, torch.randint or torch.empty of the batch's shape."
        ) from exc


def check_forward_accepts(model: nn.Module, keys: Sequence[InputKey]) -> None:
    """The forward takes ``input_fn``'s inputs: positional ones in order, keyword ones by
    name (a keyword-only argument must come from a dict)."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a forward with no readable signature: let it run
        return
    args, kwargs = call_form(keys, list(keys))
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        params = signature.parameters.values()
        keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        named = ", ".join(f"{p.name!r}: ..." for p in params if p.kind not in _VARIADIC)
        fix = (
            f"its keyword-only argument{'s' if len(keyword_only) > 1 else ''} "
            f"{', '.join(keyword_only)} must come by name: return a dict from input_fn, "
            f"e.g. lambda: {{{named}}}."
            if keyword_only and args
            else "return one tensor per argument: a tuple in the forward's order, or a "
            "dict keyed by the argument names."
        )
        raise PlanError(
            f"{type(model).__name__}.forward{_bare(signature)} does not take what input_fn "
            f"returns ({describe(keys)}): {exc}; {fix}"
        ) from exc


def call_loss_fn(loss_fn: Callable[[Any], Any], output: Any) -> Any:
    """``loss_fn(output)``, an exception it raises named as loss_fn's."""
    try:
        return loss_fn(output)
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(
            f"loss_fn raised {type(exc).__name__}{_at(exc)}: {_first_line(exc)}. It receives "
            f"the model's output, here {_kind(output)}: read the tensor the loss is computed "
            "from (lambda out: out['logits'].float().mean() for a dict)."
        ) from exc


def no_backward(
    model: nn.Module, leaves: Sequence[Any], outs: Sequence[torch.Tensor], *, with_loss: bool
) -> PlanError:
    """Why no output of the forward (or ``loss_fn``) can start a backward, asked only
    when none can. ``leaves`` are the output's pytree leaves, ``outs`` its tensors."""
    name = type(model).__name__
    wrap = "or pass loss_fn=... that turns the model's output into a loss tensor"
    if with_loss and not outs:
        return PlanError(
            f"loss_fn returned {shown(leaves[0])}, not a tensor: return the loss as a "
            "tensor computed from the model's output, e.g. lambda out: out.float().mean()."
        )
    if not outs:
        got = ", ".join(sorted({type(x).__name__ for x in leaves})) or "None"
        return PlanError(
            f"{name}'s forward returned no tensor (only {got}): autoplan reads the tensors of "
            "a tensor, a tuple, list or dict of tensors, or a Hugging Face ModelOutput. "
            f"Return those (wrap the model in a module whose forward returns them), {wrap}."
        )
    if not any(t.is_floating_point() or t.is_complex() for t in outs):
        first = outs[0]
        return PlanError(
            f"{name}'s forward returns only integer tensors (the first {first.dtype} of shape "
            f"{list(first.shape)}), which have no gradient, so there is no backward to plan: "
            f"return the floating tensor they come from (the logits, not their argmax), {wrap}."
        )
    return PlanError(
        f"no output of {name} depends on a trainable parameter, so there is no backward to "
        "plan; return the model's floating output (or pass loss_fn=...)."
    )


def forward_failed(
    exc: Exception, model: nn.Module, keys: Sequence[InputKey], xs: Sequence[torch.Tensor]
) -> PlanError:
    """The error to raise for ``exc``, raised by ``model``'s forward while tracing."""
    name = type(model).__name__
    module, line = _origin(exc, model)
    where = _where(module, line)
    if isinstance(exc, _DATA_DEPENDENT):
        op = str(exc.func)
        written = _WRITTEN_AS.get(op.rsplit(".", 1)[0], op)
        depends = "result" if isinstance(exc, DataDependentOutputException) else "output shape"
        routing = (
            " For a mixture of experts, route in the capacity form, whose shapes are fixed: "
            "autoplan.models.moe's MoEFeedForward, or a Hugging Face MoE built or prepared "
            "by autoplan.models.hf (its experts run in that form; docs/moe.md)."
            if module and _EXPERTS.search(" ".join(module))
            else ""
        )
        return PlanError(
            f"{name}'s forward calls {op} ({written}){where}, whose {depends} depends on "
            "tensor values: autoplan traces on fake tensors, which have shapes but no values. "
            "Compute it with fixed shapes (torch.where(mask, x, 0), x * mask, a sum of the "
            f"masked values), or move it out of the planned model.{routing}"
        )
    if isinstance(exc, (UnsupportedOperatorException, NotImplementedError)) or (
        "no fake impl" in str(exc)  # torch.library's custom op with no register_fake
    ):
        return PlanError(
            f"{name}'s forward raised {type(exc).__name__}{where}: {_first_line(exc)}. "
            "autoplan traces on fake tensors, and an op with no fake (meta) implementation "
            "cannot run on them: register one with torch.library.register_fake, or move the "
            "op out of the planned model."
        )
    shapes = ", ".join(
        f"{label(k)}: {list(x.shape)} {str(x.dtype).removeprefix('torch.')}"
        for k, x in zip(keys, xs, strict=True)
    )
    return PlanError(
        f"{name}'s forward raised {type(exc).__name__}{where} on the inputs ({shapes}): "
        f"{_first_line(exc)}. Check that input_fn returns the shapes and dtypes the model "
        "expects."
    )


@contextlib.contextmanager
def quiet_meta_failures() -> Iterator[None]:
    """Drop fake tensor mode's logged traceback of an op that failed on its inputs while
    tracing: the failure is raised and reported as a PlanError naming it."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("failed while attempting to run meta")

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _at(exc: BaseException, model: nn.Module | None = None) -> str:
    """Where in the user's code ``exc`` was raised, as a message says it (:func:`_origin`)."""
    return _where(*_origin(exc, model))


def _where(module: tuple[str, str] | None, line: str | None) -> str:
    parts = [f"in module {module[0]!r} ({module[1]})"] if module and module[0] else []
    if line:
        parts.append(f"at {line}")
    return (" " + " ".join(parts)) if parts else ""


def _origin(
    exc: BaseException, model: nn.Module | None = None
) -> tuple[tuple[str, str] | None, str | None]:
    """The innermost module of ``model`` on ``exc``'s stack (its name and class) and the
    innermost ``path:line`` outside torch and autoplan."""
    names = {id(m): (n, type(m).__name__) for n, m in model.named_modules()} if model else {}
    module, line = None, None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if id(owner) in names and isinstance(owner, nn.Module):
            module = names[id(owner)]
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith(_LIBRARIES) and not path.startswith("<"):
            line = f"{path}:{tb.tb_lineno}"
        tb = tb.tb_next
    return module, line


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations, as a person reads it in a message."""
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=signature.empty)


def shown(value: Any) -> str:
    """A value as a message names it: its type, and a short repr."""
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    if callable(value) and hasattr(value, "__name__"):
        return f"{type(value).__name__} {value.__name__}"
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _kind(output: Any) -> str:
    """What a model returned, for a message: ``a dict with keys loss, logits``."""
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {', '.join(map(str, output))}"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)}"
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {list(output.shape)}"
    return f"a {type(output).__name__}"


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, without a closing period (the message goes on)."""
    return (str(exc).strip().splitlines() or [""])[0].rstrip(".")
