"""Helpers for the tests that run a plan on several gloo processes (``mp.spawn``)."""

from __future__ import annotations

import ctypes
import json
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port nothing listens on now, for the process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(fn, world: int, out_dir: str, *args) -> list:
    """``fn(rank, *args)`` on ``world`` gloo processes (one thread each), the default group
    initialized around it; returns each rank's JSON-serializable result, in rank order."""
    mp.spawn(_worker, args=(fn, world, free_port(), out_dir, args), nprocs=world, join=True)
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


def _worker(rank: int, fn, world: int, port: int, out_dir: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    try:
        result = fn(rank, *args)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        # every rank here: a gloo worker thread still finishing a collective of the test's
        # own (autoplan's calls return only once theirs are done, autoplan.runtime.release) takes
        # the GIL while this one waits, rather than at the interpreter's teardown
        dist.barrier()
    finally:
        dist.destroy_process_group()


def gil_waiters(hold_s: float = 0.2) -> int:
    """How many threads Python did not start are waiting for (or holding) the GIL after
    this one has held it for ``hold_s`` seconds.

    A gloo worker thread that must free a Python object takes the GIL for it (pybind11
    gives the thread a Python thread state first); the interpreter's teardown ends such a
    thread inside a destructor, which aborts the process (autoplan.runtime.release). Holding the
    GIL long enough for any such worker to be waiting, then counting the thread states
    beyond Python's own threads, shows whether one was left at this point.
    """
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)  # no hand-over to a waiting thread while holding
    try:
        end = time.perf_counter() + hold_s
        while time.perf_counter() < end:
            pass
        return _thread_states() - threading.active_count()
    finally:
        sys.setswitchinterval(old)


def _thread_states() -> int:
    api = ctypes.pythonapi
    api.PyInterpreterState_Main.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    count, state = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Main())
    while state:
        count += 1
        state = api.PyThreadState_Next(state)
    return count
