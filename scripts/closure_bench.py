"""Floyd-Warshall on the one-move matrices the planner closes for a run file: the one
autoplan uses (:func:`autoplan.cost.closure.closure`, scipy's csgraph) against the others.

A benchmark, not part of planning. It plans the run file once per ``--mm-mode``, keeping
every matrix handed to ``closure``, then times over all of them (the sum, best of
``--repeat``, round-robin so that load drifts hit every candidate alike):

* ``closure``: :func:`~autoplan.cost.closure.closure` (scipy's ``floyd_warshall`` on
  ``csgraph_from_dense(m, null_value=inf)``; a dense or masked array would drop the
  zero-price moves);
* ``scipy (prebuilt sparse)``: the same call on graphs built beforehand;
* ``numpy loop``: n passes of one add and one minimum over n x n arrays, in place (the
  closure autoplan had before);
* ``networkx``: ``floyd_warshall_numpy``, the whole call with the graph built from the
  matrix, then on a prebuilt graph (networkx is a test dependency only);

and prints each one's total, its time on the largest network, and whether its distances
equal closure's (``inf`` where closure's are).

    python scripts/closure_bench.py configs/llama3_70b.yaml
    python scripts/closure_bench.py configs/llama3_70b.yaml --save /tmp/direct.npz
    python scripts/closure_bench.py --load /tmp/direct.npz

Why: closure.py uses scipy because of these figures, so that they can be measured again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
from scipy.sparse.csgraph import csgraph_from_dense, floyd_warshall

import autoplan.cost.closure as closure_module
from autoplan.cost.closure import closure
from autoplan.tools.cli import main as cli_main


def collect(config: str, mm_modes: list[str]) -> list[np.ndarray]:
    """Every matrix the planner closes while planning ``config`` in each of ``mm_modes``."""
    seen: list[np.ndarray] = []

    def recording(direct: np.ndarray) -> np.ndarray:
        seen.append(direct.copy())  # list.append is atomic: worker threads close too
        return closure(direct)

    closure_module.closure = recording
    try:
        for mode in mm_modes:
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli_main(["plan", config, "--mm-mode", mode, "--quiet"])
            if code != 0:
                raise SystemExit(f"autoplan plan {config} --mm-mode {mode} exited {code}")
    finally:
        closure_module.closure = closure
    return seen


def _graph(direct: np.ndarray) -> nx.DiGraph:
    n = len(direct)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    src, dst = np.nonzero(np.isfinite(direct) & ~np.eye(n, dtype=bool))
    g.add_weighted_edges_from(
        zip(src.tolist(), dst.tolist(), direct[src, dst].tolist(), strict=True)
    )
    return g


def numpy_loop(direct: np.ndarray) -> np.ndarray:
    """Floyd-Warshall as n numpy passes of one add and one minimum, in place."""
    n = len(direct)
    dist = direct.astype(np.float64, copy=True)
    np.fill_diagonal(dist, 0.0)
    via = np.empty_like(dist)
    for k in range(n):
        np.add(dist[:, k : k + 1], dist[k : k + 1, :], out=via)
        np.minimum(dist, via, out=dist)
    return dist


def candidates(nets: list[np.ndarray]) -> dict[str, tuple[Callable, list]]:
    """Name -> (function, its input per network)."""
    return {
        "closure": (closure, nets),
        "scipy (prebuilt sparse)": (
            lambda s: floyd_warshall(s, directed=True),
            [csgraph_from_dense(d, null_value=np.inf) for d in nets],
        ),
        "numpy loop": (numpy_loop, nets),
        "networkx (graph built + call)": (
            lambda d: nx.floyd_warshall_numpy(_graph(d), nodelist=range(len(d))),
            nets,
        ),
        "networkx (prebuilt graph)": (
            lambda g: nx.floyd_warshall_numpy(g, nodelist=range(len(g))),
            [_graph(d) for d in nets],
        ),
    }


def _equal(got: np.ndarray, want: np.ndarray) -> bool:
    finite = np.isfinite(want)
    return bool(np.array_equal(np.isinf(got), ~finite) and np.allclose(got[finite], want[finite]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", help="run file to plan (not with --load)")
    ap.add_argument("--mm-mode", action="append", choices=["einsum", "native"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--save", help="write the collected matrices here (np.savez)")
    ap.add_argument("--load", help="time the matrices of an earlier --save instead")
    args = ap.parse_args()
    if args.load:
        with np.load(args.load) as z:
            nets = [z[k] for k in z.files]
    elif args.config:
        nets = collect(args.config, args.mm_mode or ["einsum", "native"])
    else:
        ap.error("give a run file or --load")
    if args.save:
        np.savez(args.save, *nets)
    largest = max(range(len(nets)), key=lambda i: len(nets[i]))
    print(f"{len(nets)} networks, the largest of {len(nets[largest])} states")
    want = [closure(d) for d in nets]
    cands = candidates(nets)
    totals: dict[str, list[float]] = {name: [] for name in cands}
    for _ in range(args.repeat):
        for name, (fn, inputs) in cands.items():
            start = time.perf_counter()
            for x in inputs:
                fn(x)
            totals[name].append(time.perf_counter() - start)
    for name, (fn, inputs) in cands.items():
        equal = all(_equal(fn(x), w) for x, w in zip(inputs, want, strict=True))
        best_largest = min(_timed(fn, inputs[largest]) for _ in range(args.repeat))
        print(
            f"{name:36s} {min(totals[name]):7.3f} s  largest {best_largest:6.3f} s  "
            f"equal: {'yes' if equal else 'NO'}"
        )


def _timed(fn: Callable, x) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
