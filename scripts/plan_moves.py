"""Run the ``_StridedShard`` redistributions a plan makes, on small tensors, and check them.

Usage: ``python scripts/plan_moves.py CONFIG [--set KEY=VALUE ...] [--plan PLAN.json] [--all]``

Plans the run file (or reads a plan saved from it), prices its edges again
(:func:`autoplan.tools.rebuild.rebuild`) and collects every distinct move the plan makes, hop
by hop along its routes, with a ``_StridedShard`` on either side (every move with
``--all``). Each runs through :func:`autoplan.runtime.execute.move` under ``LocalTensorMode`` on
the plan's mesh, on a tensor of the same rank and a small shape: each dim is the product
of the mesh axes that shard it on either side, times its largest split factor, times 2.
Printed per move: how many edges make it, the collectives that ran and those priced, and
whether every rank holds the shard DTensor's ``distribute_tensor`` gives the target
layout (for a ``Partial`` target, whether the full tensor is the source's). A check of
real plans for the README (the 70B plan takes minutes); the rule that keeps torch's
wrong strided moves out of plans is tested in ``tests/integration/test_redistribute_execution.py``.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import Counter

from move_check import (  # scripts/move_check.py: a script's own folder is on sys.path
    right_values,
    run_move,
)

from autoplan.core.mesh import fake_mesh
from autoplan.core.placements import Placements, fmt, is_strided, sharded_dim
from autoplan.core.torch_adapter import LocalTensorMode
from autoplan.result.plan import Plan
from autoplan.runtime.execute import flatten_mesh_groups
from autoplan.tools.rebuild import rebuild
from autoplan.tools.run_plan import run_plan
from autoplan.tools.runfile import load_run


def _moves(rb) -> Counter[tuple[Placements, Placements, int]]:
    """Each (source, target, rank) hop of the plan's moves, with how many edges make it."""
    found: Counter[tuple[Placements, Placements, int]] = Counter()
    for e in rb.costs.edges:
        if e.tensor is None or e.src not in rb.choice or e.dst not in rb.choice:
            continue
        row, col = e.src_group[rb.choice[e.src]], e.dst_group[rb.choice[e.dst]]
        for a, b in itertools.pairwise(e.route(int(row), int(col))):
            if a != b:
                found[a, b, len(e.tensor.shape)] += 1
    return found


def _shape(src: Placements, dst: Placements, rank: int, mesh_shape: tuple[int, ...]) -> tuple:
    size = [2] * rank
    for dim in range(rank):
        for side in (src, dst):
            axes = [a for a, p in enumerate(side) if sharded_dim(p) == dim]
            factor = max((p.split_factor for p in side if is_strided(p)), default=1)
            need = 2 * factor * math.prod(mesh_shape[a] for a in axes)
            size[dim] = max(size[dim], need)
    return tuple(size)


def _run(mesh, redist, src: Placements, dst: Placements, shape: tuple) -> str:
    ran, priced, out, x = run_move(mesh, redist, src, dst, shape)
    right = right_values(mesh, out, x, dst)
    verdict = "as priced" if ran == priced else f"ran {ran}, priced {priced}"
    return f"{verdict}; {'right' if right else 'WRONG'} shards"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--plan", help="a plan saved from this run file (else it is planned)")
    ap.add_argument("--all", action="store_true", help="every move, not only strided ones")
    args = ap.parse_args()
    run = load_run(args.config, args.set)
    plan = Plan.load(args.plan) if args.plan else run_plan(run, quiet=True)
    rb = rebuild(run, plan)
    moves = {
        m: n
        for m, n in _moves(rb).items()
        if args.all or any(is_strided(p) for p in (*m[0], *m[1]))
    }
    print(f"{args.config}: {plan.status}, {plan.objective_us / 1e3:.2f} ms, {len(moves)} moves")
    mesh = fake_mesh(run.mesh_shape, run.axis_names)
    counts: Counter[str] = Counter()
    with LocalTensorMode(mesh.size()):
        flatten_mesh_groups(mesh)
        for (src, dst, rank), n in sorted(moves.items(), key=lambda kv: -kv[1]):
            shape = _shape(src, dst, rank, run.mesh_shape)
            try:
                result = _run(mesh, rb.redist, src, dst, shape)
            except Exception as err:  # noqa: BLE001 - torch's strided path raises many kinds
                result = f"raised {type(err).__name__}: {str(err).splitlines()[0][:80]}"
            counts[result.split(";")[0] if "raised" not in result else "raised"] += 1
            counts["wrong shards"] += "WRONG" in result
            print(f"{n:6d} edges  {fmt(src)} -> {fmt(dst)} on {shape}: {result}", flush=True)
    print(dict(counts))


if __name__ == "__main__":
    main()
