"""Checks of the arguments a user hands :func:`autoplan.plan`, before anything is traced.

Input: ``plan``'s arguments. Output: nothing, or a :class:`~autoplan.core.errors.PlanError`
naming the argument, its value, what autoplan accepts and how to get there (which
constructor to call, how to wrap the model).

Why: a wrong kind of argument (a tuple for the mesh, a dict for the config, a tensor
for ``input_fn``) would otherwise surface deep in a later stage as an
``AttributeError`` about a ``tuple``. What the forward receives and returns is checked
while tracing (:mod:`autoplan.trace.forward_checks`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.core.config import PlanConfig
from autoplan.core.errors import PlanError
from autoplan.trace.forward_checks import shown


def check_plan_args(
    *,
    model: Any,
    input_fn: Any,
    mesh: Any,
    config: Any,
    input_placements: Any,
    output_placements: Any,
    pins: Any,
    loss_fn: Any,
    progress: Any,
) -> None:
    """Refuse an argument of :func:`autoplan.plan` of the wrong kind before tracing."""
    _check_model(model)
    _check_input_fn(input_fn)
    if not isinstance(mesh, DeviceMesh):
        shape = tuple(mesh) if _is_shape(mesh) else (2, 4)
        names = ("dp", "tp", "cp", "pp")[: len(shape)]
        raise PlanError(
            f"mesh must be a DeviceMesh, got {shown(mesh)}: plan on "
            f"autoplan.fake_mesh({shape}, {names}) (any size, on one CPU), or pass "
            "the job's own DeviceMesh (torch.distributed.device_mesh.init_device_mesh)."
        )
    if config is not None and not isinstance(config, PlanConfig):
        fix = (
            "autoplan.PlanConfig(**d)"
            if isinstance(config, Mapping)
            else "autoplan.PlanConfig(...)"
        )
        raise PlanError(
            f"config must be an autoplan.PlanConfig, got {shown(config)}: write config={fix}."
        )
    _check_placements_arg("input_placements", input_placements, "input", keyed=True)
    _check_placements_arg("output_placements", output_placements, "output tensor", keyed=False)
    if pins is not None and not isinstance(pins, Mapping):
        raise PlanError(
            f"pins must be a dict from a parameter FQN (or graph node name) to a placement, "
            f"got {shown(pins)}: write pins={{'layers.0.wq.weight': 'RS(0)'}}."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise PlanError(
            f"loss_fn must be a function from the model's output to a loss tensor, got "
            f"{shown(loss_fn)}: write loss_fn=lambda out: out.float().mean(), or leave it out."
        )
    if progress is not None and not callable(progress):
        raise PlanError(
            f"progress must be a function taking a phase name, got {shown(progress)}: "
            "write progress=print, or leave it out."
        )


def _check_model(model: Any) -> None:
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise PlanError(
            f"model is the class {model.__name__}, not a model: pass an instance, "
            f"model={model.__name__}(...) (on the meta device to allocate nothing)."
        )
    if not isinstance(model, nn.Module):
        raise PlanError(
            f"model must be a torch.nn.Module, got {shown(model)}: wrap a function in a "
            "module whose weights are nn.Parameter attributes and whose forward calls it."
        )
    trainable = sum(p.requires_grad for p in model.parameters())
    if not trainable:
        frozen = sum(1 for _ in model.parameters())
        why = (
            f"its {frozen} parameters all have requires_grad=False: unfreeze them for "
            "planning (model.requires_grad_(True))."
            if frozen
            else "give it its weights as nn.Parameter attributes or registered submodules."
        )
        raise PlanError(
            f"{type(model).__name__} has no trainable parameters (requires_grad=True), so a "
            f"training step has nothing to place or update; {why}"
        )


def _check_input_fn(input_fn: Any) -> None:
    if not callable(input_fn):
        example = "lambda: x" if isinstance(input_fn, torch.Tensor) else "lambda: (x, y)"
        raise PlanError(
            f"input_fn must be a function returning the model's example inputs, got "
            f"{shown(input_fn)}: write input_fn={example} (called under a fake mode, "
            "lambda: torch.randn(8, 128) allocates nothing)."
        )
    try:
        signature = inspect.signature(input_fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    try:
        signature.bind()
    except TypeError as exc:
        raise PlanError(
            f"input_fn{signature} is called with no arguments ({exc}): bind them, "
            "e.g. input_fn=lambda: make_batch(8)."
        ) from exc


def _check_placements_arg(what: str, specs: Any, per: str, *, keyed: bool) -> None:
    """One placement for all, a list or tuple with one per ``per`` (or a dict keyed like
    ``input_fn``'s, when ``keyed``); the entries themselves are parsed later."""
    if specs is None or isinstance(specs, Sequence) or (keyed and isinstance(specs, Mapping)):
        return
    forms = f"one placement for every {per} ('S(0)R'), a list with one per {per} (['S(0)R', None])"
    if keyed:
        forms += " or a dict keyed like input_fn's ({'input_ids': 'S(0)R'})"
    raise PlanError(f"{what} must be {forms}, got {shown(specs)}.")


def _is_shape(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list))
        and 0 < len(value) <= 4
        and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    )
