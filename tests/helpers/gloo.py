"""Helpers for the tests that run a plan on several gloo processes (``mp.spawn``)."""

from __future__ import annotations

import json
import os
import socket
import sys
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


def exit_worker() -> None:
    """End a spawned worker that finished its work and destroyed its process group.

    Without this, the interpreter's teardown sometimes aborts the process (``terminate
    called without an active exception``, SIGABRT) after every check passed and the
    results were written: gloo's threads still hold work with tensors when the
    interpreter goes away (pytorch/pytorch#179291 describes it). In this suite it hit 2
    of 9 runs of tests/test_apply.py in one afternoon. A worker that raised still exits
    through ``mp.spawn``'s own path, which reports the error.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    finally:
        dist.destroy_process_group()
    exit_worker()
