"""release: a program's collectives run on aliases the keeper holds until their worker lets
go (on gloo processes: tests/integration/test_hf_training.py checks no worker is left to free a buffer
once a step returns)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import fx

from autoplan.runtime import release
from autoplan.runtime.release import Keeper, hold_collectives

_C10D = torch.ops._c10d_functional


class _Worker:
    """Stands in for a process group's worker thread: holds C++ references (views keep
    their base) to what it was handed and made until told to let go."""

    def __init__(self) -> None:
        self.given: list[torch.Tensor] = []
        self.holding: list[torch.Tensor] = []

    def all_gather(self, x: torch.Tensor, n: int, group: str) -> torch.Tensor:
        out = torch.cat([x] * n)
        self.given += [x, out]
        self.holding += [x.view(-1), out.view(-1)]
        return out


def test_a_collective_runs_on_aliases_held_until_its_worker_lets_go():
    """The op gets a detached alias, not the caller's tensor; the keeper holds the alias and
    the op's output while the worker does, and lets go once it has."""
    keeper, worker = Keeper(), _Worker()
    gather = keeper.collective(worker.all_gather)
    x = torch.arange(3.0)
    out = gather(x, 2, "0")
    assert worker.given[0] is not x and worker.given[0].data_ptr() == x.data_ptr()
    assert out is not worker.given[1] and out.data_ptr() == worker.given[1].data_ptr()
    assert torch.equal(out, torch.cat([x, x]))
    assert keeper.pending == 2
    worker.holding.clear()
    assert keeper.pending == 0


def test_settle_returns_once_a_late_worker_lets_go():
    """settle() waits (GIL released) for a worker that drops its buffers later."""
    keeper, worker = Keeper(), _Worker()
    keeper.collective(worker.all_gather)(torch.ones(4), 2, "0")
    done = threading.Event()

    def late() -> None:
        time.sleep(0.05)
        worker.holding.clear()
        done.set()

    threading.Thread(target=late).start()
    keeper.settle()
    assert done.is_set() and keeper.pending == 0


def test_a_cpu_collectives_wait_returns_once_its_worker_lets_go(monkeypatch):
    """The wait of a CPU collective returns only after its own worker dropped the work's
    buffers, so none outlives the program's last use of it, however late the worker runs;
    another collective's buffers are left to their own wait."""
    monkeypatch.setattr(release, "_WAIT", lambda t: t)  # the work is done; its worker is late
    keeper, worker, other = Keeper(), _Worker(), _Worker()
    out = keeper.collective(worker.all_gather)(torch.ones(4), 2, "0")
    keeper.collective(other.all_gather)(torch.ones(4), 2, "0")
    dropped = threading.Event()

    def late() -> None:
        time.sleep(0.05)
        dropped.set()
        worker.holding.clear()

    threading.Thread(target=late).start()
    assert keeper.wait(out) is out
    assert dropped.is_set() and keeper.pending == 2  # the other collective's two


def test_settle_raises_for_a_buffer_never_released(monkeypatch):
    """A collective nobody waited for (its worker never lets go) is an error, not a hang."""
    keeper, worker = Keeper(), _Worker()
    keeper.collective(worker.all_gather)(torch.ones(4), 2, "0")
    monkeypatch.setattr(release, "_SETTLE_LIMIT_S", 0.01)
    with pytest.raises(RuntimeError, match="never waited for"):
        keeper.settle()


def test_hold_collectives_wraps_collectives_and_waits_in_a_copy():
    """Collectives and waits of the copy run through the keeper; the original graph (the one a
    step prints and counts) keeps torch's ops."""
    g = fx.Graph()
    x = g.placeholder("x")
    gathered = g.call_function(_C10D.all_gather_into_tensor.default, (x, 2, "0"))
    g.output(
        g.call_function(
            torch.ops.aten.relu.default, (g.call_function(_C10D.wait_tensor.default, (gathered,)),)
        )
    )
    gm = fx.GraphModule(torch.nn.Module(), g)
    keeper = Keeper()
    held = hold_collectives(gm, keeper)
    targets = [n.target for n in held.graph.nodes if n.op == "call_function"]
    assert targets[0].__name__ == "held_all_gather_into_tensor_default"
    assert targets[1] == keeper.wait and targets[2] is torch.ops.aten.relu.default
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        _C10D.all_gather_into_tensor.default, _C10D.wait_tensor.default,
        torch.ops.aten.relu.default,
    ]  # fmt: skip
