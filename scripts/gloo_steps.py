"""What the scripts that time parallelized steps on several processes share.

Input: a step to time (a callable) under an initialised process group, or a model's
parameters to pin. Output: the step's time as the slowest rank saw it, a free port for
the group's rendezvous, torchtitan's tensor-parallel layout as pins, and the
allocator settings CPU workers run with (:data:`KEEP_FREED`, set by :func:`worker_env`).

Why one module: ``scripts/fidelity.py`` and ``scripts/bench_apply.py`` measure the same
way, so their figures compare; written once, they cannot drift apart.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

# On a CPU, glibc's malloc keeping freed memory mapped, as a GPU's caching allocator keeps
# it: by default it hands a step's large buffers back to the OS and faults them in again
# the next step, a cost of the OS no GPU job pays and the prices leave out (read by glibc
# when a process starts, so set for the workers only; a setting of the caller's is kept).
KEEP_FREED = {
    "MALLOC_MMAP_THRESHOLD_": str(2**25),  # the largest glibc takes
    "MALLOC_TRIM_THRESHOLD_": str(2**32),
    "MALLOC_TOP_PAD_": str(2**28),
}


@contextlib.contextmanager
def worker_env(defaults: dict[str, str]) -> Iterator[None]:
    """``defaults`` in the environment the workers inherit, where the caller set none;
    this process's environment restored after."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            del os.environ[k]


def free_port() -> int:
    """A TCP port on the loopback no process listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_ms(step: Callable[[], T], device: str = "cpu") -> tuple[float, T]:
    """One call of ``step``: its time in ms, the slowest rank's (every rank starts
    together after a barrier), and what it returned."""
    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    result = step()
    _sync(device)
    elapsed = torch.tensor([time.perf_counter() - start], device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed) * 1e3, result


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def layout_pins(
    fqns: Iterable[str], colwise: Sequence[str], rowwise: Sequence[str]
) -> dict[str, str]:
    """torchtitan's layout on a (dp, tp) mesh: every parameter sharded by rows on dp (as
    FSDP shards it), the input projections ``colwise`` also by rows on tp, the output
    projections ``rowwise`` by columns on tp, the rest replicated on tp."""
    out = {}
    for fqn in fqns:
        if any(f".{m}." in f".{fqn}" for m in colwise):
            out[fqn] = "S(0)S(0)"
        elif any(f".{m}." in f".{fqn}" for m in rowwise):
            out[fqn] = "S(0)S(1)"
        else:
            out[fqn] = "S(0)R"
    return out
