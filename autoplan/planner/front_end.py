"""The stages before the solver, once for every tool: a model -> its priced problem.

Stages 1-4: trace -> rewrite -> strategies -> placement constraints -> cost. Input:
what :func:`autoplan.plan` takes (the model, ``input_fn``, the mesh, the config, the
input and output placements, the pins, ``loss_fn``) and a timer. Output: a
:class:`~autoplan.planner.problem.PricedProblem` (the rewritten graph, its strategy table, its
cost table, the config and the constraint masks), yielded inside a ``with`` block
that keeps the traced heap out of the garbage collector's passes.

Why one function: :func:`autoplan.plan` solves this problem, and ``explain`` and
``compare --out`` read a saved plan back into it (:mod:`autoplan.tools.rebuild`). All of
them must see the same graph, prices and constraints, and so the same merged groups
and twins (:func:`autoplan.planner.solve_mode.structure`); written once, they cannot
diverge.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from autoplan.core.config import PlanConfig
from autoplan.core.torch_adapter import DeviceMesh
from autoplan.cost.price import price
from autoplan.planner.problem import PricedProblem, Timer
from autoplan.rewrite import rewrite
from autoplan.strategies.constraints import (
    InputPlacements,
    PinSpec,
    PlacementSpec,
    allowed_strategies,
)
from autoplan.strategies.enumerate import enumerate_strategies
from autoplan.trace.capture import LossFn, trace_joint

__all__ = ["front_end", "untimed"]


def untimed(phase: str) -> Callable[[], None]:
    """A :data:`~autoplan.planner.problem.Timer` that times nothing."""
    return lambda: None


@contextlib.contextmanager
def front_end(
    model: nn.Module,
    input_fn: Callable[[], Any],
    mesh: DeviceMesh,
    *,
    config: PlanConfig,
    input_placements: InputPlacements | None = None,
    output_placements: Sequence[PlacementSpec] | None = None,
    pins: Mapping[str, PinSpec] | None = None,
    loss_fn: LossFn | None = None,
    timed: Timer = untimed,
) -> Iterator[PricedProblem]:
    """Trace ``model`` on ``input_fn``'s inputs, rewrite, enumerate, constrain and price it
    on ``mesh``; yield the :class:`~autoplan.planner.problem.PricedProblem`. ``timed(phase)`` is
    called as each phase starts and its result when it ends."""
    done = timed("trace")
    traced = trace_joint(
        model,
        input_fn,
        loss_fn=loss_fn,
        param_dtype=config.param_torch_dtype,
        stamp_layers=config.stamp_layers,
    )
    done()
    with _frozen_heap():
        done = timed("rewrite")
        traced, _ = rewrite(traced, mm_mode=config.mm_mode)
        done()
        done = timed("strategies")
        table = enumerate_strategies(traced, mesh, mm_mode=config.mm_mode)
        done()
        allowed, pinned = allowed_strategies(
            traced, table, input_placements, output_placements, pins
        )
        done = timed("cost")
        costs = price(
            table,
            traced,
            config.topology,
            optimizer_states=config.optimizer_states,
            master_bytes=4 if config.param_dtype is not None else None,
            reduce_bytes=config.reduce_dtype_bytes,
            routes=config.routes,
        )
        done()
        yield PricedProblem(traced, table, costs, config, allowed, pinned)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Keep the objects alive now out of the garbage collector's passes until the end,
    and collect the young generation less often; both restored on exit.

    The traced graph, its fake tensors and torch's state outlive every later stage, so
    a full collection would walk them again for nothing: ``gc.freeze`` moves them to
    the permanent generation (Python docs, ``gc.freeze``). The later stages make
    millions of small acyclic objects (placement tuples, strategies, keys), for which
    the default young threshold runs the collector far more often than it finds cycles.
    A caller that froze its own heap keeps it frozen: ``gc.unfreeze`` cannot tell its
    objects from ours, so then nothing is frozen here.
    """
    thresholds = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    gc.set_threshold(_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if ours:
            gc.unfreeze()


# Allocations between young collections while planning (see _frozen_heap).
_YOUNG_THRESHOLD = 10_000
