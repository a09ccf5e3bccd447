"""Stage 7, release: every buffer a collective holds is handed back on the caller's thread.

Input: a lowered program (an ``fx.GraphModule`` of local aten ops and ``_c10d_functional``
collectives, :mod:`autoplan.runtime.lower`). Output: a copy of it whose collectives run through a
:class:`Keeper`, and the keeper, whose :meth:`Keeper.settle` returns once the process
group's worker threads have let go of every buffer the program's collectives held.

Why: gloo runs a collective on a worker thread, which drops its references to the
collective's tensors after the work is done, some time after ``wait_tensor`` returned.
A program frees its temporaries as soon as it no longer reads them; when Python frees a
tensor that C++ still holds, torch hands the tensor's Python object over to the C++
tensor, and whichever thread drops the last C++ reference must take the GIL to free it.
If that is the worker, and the interpreter has begun to shut down by the time it gets
the GIL, Python ends the thread (``pthread_exit``) inside a destructor that may not
throw: ``std::terminate``, "terminate called without an active exception", SIGABRT.
A job that finished its work and called ``destroy_process_group`` then fails at exit
(pytorch/pytorch#179291 describes the race; the process groups a ``DeviceMesh`` holds,
with their threads, live until the interpreter's teardown).

So a collective is handed detached aliases of its inputs (:meth:`torch.Tensor.detach`:
a new tensor on the same storage, which nothing but the keeper and the collective
references), and the keeper holds them and the collective's outputs until the worker has
dropped them: a tensor's use count falls back to one, the keeper's own reference. Python
still owns each of them when the worker lets go, so the worker frees no Python object
and needs no GIL, and no program returns while a worker still holds one of its buffers.
The keeper lets each buffer go at the first collective or wait after its release (then
the program's own references decide, as before). A CPU collective's wait also waits for its
own worker to let go (microseconds: the worker drops a work right after completing it), so
a buffer's life ends where the program's last use ends, however the machine is loaded, as
the memory estimate assumes; a device's collectives are left to the next release, since
their worker lets go only when the device has run them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.distributed.tensor import DTensor
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.core.torch_adapter import isolated_trace

__all__ = ["Keeper", "full_tensors", "hold_collectives"]

_WAIT = torch.ops._c10d_functional.wait_tensor.default
# A worker drops a finished work's buffers within microseconds unless the machine is
# loaded; this bounds the wait for one that never does (a collective nobody waited for).
_SETTLE_LIMIT_S = 300.0
# A wait gives up on its own worker after this long and leaves the buffers to a later release.
_WAIT_LIMIT_S = 10.0


class Keeper:
    """The aliases a program's collectives hold, kept until their worker drops them."""

    def __init__(self) -> None:
        self._held: list[torch.Tensor] = []
        # a CPU collective's held buffers, by the storage of each of its outputs
        self._works: dict[int, list[torch.Tensor]] = {}

    @property
    def pending(self) -> int:
        """How many buffers a worker thread may still hold."""
        self._prune()
        return len(self._held)

    def collective(self, op: Callable[..., Any]) -> Callable[..., Any]:
        """``op`` run on detached aliases of its tensor inputs, the aliases and its
        outputs held by this keeper; returns detached aliases of the outputs (which
        ``wait_tensor`` finds: works are registered by storage)."""

        def held(*args: Any, **kwargs: Any) -> Any:
            self._prune()
            given = len(self._held)
            out = op(*_map_tensors(args, self._alias), **kwargs)
            outs = _tensors(out)
            self._held += outs  # the outputs themselves: the work holds those
            if outs and all(t.device.type == "cpu" for t in outs):
                work = self._held[given:]
                self._works.update((_storage(t), work) for t in outs if t.numel())
            return _map_tensors(out, torch.Tensor.detach)

        held.__name__ = held.__qualname__ = "held_" + op.__name__.replace(".", "_")
        return held

    def wait(self, tensor: torch.Tensor) -> torch.Tensor:
        """``wait_tensor``; a CPU collective's also waits for its worker to let go of the
        work; then let go of the buffers already released."""
        out = _WAIT(tensor)
        work = self._works.get(_storage(tensor)) if tensor.numel() else None
        if work is not None:
            self._release(work)
        self._prune()
        return out

    def _release(self, work: list[torch.Tensor]) -> None:
        """Wait (GIL released) until a finished work's worker lets go of its buffers."""
        self._works = {k: w for k, w in self._works.items() if w is not work}
        _wait_until(lambda: not any(_shared(t) for t in work), _WAIT_LIMIT_S)

    def settle(self) -> None:
        """Return once every held buffer is released by its worker, then let go of all.

        Sleeping releases the GIL, which a worker does not need for these buffers; the
        wait is bounded so that a collective nobody waited for raises instead of hanging.
        """
        if not _wait_until(lambda: not self.pending, _SETTLE_LIMIT_S):
            raise RuntimeError(
                f"{len(self._held)} collective buffers were not released by their "
                f"process group's worker thread within {_SETTLE_LIMIT_S:.0f} s: a "
                "collective of the lowered program was never waited for."
            )

    def _alias(self, tensor: torch.Tensor) -> torch.Tensor:
        alias = tensor.detach()
        self._held.append(alias)
        return alias

    def _prune(self) -> None:
        # a use count of one: only this list holds the alias (its worker has dropped it)
        self._held = [t for t in self._held if _shared(t)]


def hold_collectives(gm: fx.GraphModule, keeper: Keeper) -> fx.GraphModule:
    """A copy of ``gm`` whose ``_c10d_functional`` collectives and waits run through
    ``keeper`` (``gm`` itself is left as it is: it is what a step prints and counts)."""
    graph = copy.deepcopy(gm.graph)
    wrapped: dict[Any, Callable[..., Any]] = {}
    for node in graph.nodes:
        if getattr(node.target, "namespace", None) != "_c10d_functional":
            continue
        if node.target is _WAIT:
            node.target = keeper.wait
        else:
            node.target = wrapped.setdefault(node.target, keeper.collective(node.target))
    return fx.GraphModule(gm, graph)


def full_tensors(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each DTensor of ``values`` as its full (global) tensor, a plain tensor as it is.

    DTensor's own ``full_tensor`` gathers with the same collectives, but on temporaries
    this function cannot hold; here they are recorded once (``make_fx`` on fake local
    shards, as :func:`autoplan.runtime.lower.lower` records a step) and run through a
    :class:`Keeper`, so that the call returns with no buffer left on a worker thread. A
    collective: call it on every rank.
    """
    placed = [(i, v) for i, v in enumerate(values) if isinstance(v, DTensor)]
    if not placed:
        return list(values)

    def gather(local: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            DTensor.from_local(
                x, d.device_mesh, d.placements, run_check=False, shape=d.shape,
                stride=d.stride(),
            ).full_tensor()
            for x, (_, d) in zip(local, placed, strict=True)
        ]  # fmt: skip

    local = [d.to_local() for _, d in placed]
    with isolated_trace(), torch.no_grad():
        traced = make_fx(gather, tracing_mode="fake")(local)
    keeper = Keeper()
    full = hold_collectives(traced, keeper)(local)
    keeper.settle()
    out = list(values)
    for (i, _), x in zip(placed, full, strict=True):
        out[i] = x
    return out


def _wait_until(done: Callable[[], bool], limit_s: float) -> bool:
    """Sleep (the GIL released) in growing pauses until ``done()``; False after ``limit_s``."""
    pause, start = 0.0, time.monotonic()
    while not done():
        if time.monotonic() - start > limit_s:
            return False
        time.sleep(pause)
        pause = min(2 * pause + 1e-6, 1e-3)
    return True


def _shared(tensor: torch.Tensor) -> bool:
    """Whether anything besides the keeper (a worker) still holds ``tensor``."""
    # TensorBase._use_count exists; torch's stubs omit it
    return tensor._use_count() > 1  # type: ignore[attr-defined]


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    return []


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    return obj
