"""Which moves of ``_StridedShard`` placements torch runs as the cost model prices them.

Usage: ``python scripts/strided_moves.py [--mesh 2x2] [--shape 8x8] [--via dtensor|move]``

Every move between placement tuples built from R, P, S(0), S(1), _S(0,1) and _S(0,2)
with a strided placement on either side is run under ``LocalTensorMode`` (one process
simulating every rank, with the flattened meshes ``apply`` creates), through DTensor's
redistribute or through ``autoplan.runtime.execute.move``; each is compared with the
collectives :class:`RedistributeModel` prices and with the shards ``distribute_tensor``
gives each rank. Prints the counts and every move that differs; moves priced impossible
(``_strided_ok`` refuses those torch's strided path gets wrong) are not run. ``--via
dtensor`` runs DTensor's redistribute alone, without ``execute.move``'s relabeling of
``_S(d,1)``. ``tests/integration/test_redistribute_execution.py`` checks that every move priced
possible runs as priced.
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

import autoplan
from autoplan.core.placements import fmt
from autoplan.core.topology import Topology
from autoplan.core.torch_adapter import (
    LocalTensorMode,
    Partial,
    Replicate,
    Shard,
    _StridedShard,
    redistribute,
)
from autoplan.cost.collectives import CollectiveModel
from autoplan.cost.redistribute import RedistributeModel
from autoplan.runtime.execute import flatten_mesh_groups, move

CHOICES = (
    Replicate(),
    Partial(),
    Shard(0),
    Shard(1),
    _StridedShard(0, split_factor=1),
    _StridedShard(0, split_factor=2),
)


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mesh", default="2x2")
    ap.add_argument("--shape", default="8x8")
    ap.add_argument("--via", choices=("dtensor", "move"), default="move")
    args = ap.parse_args()
    mesh_shape, shape = _dims(args.mesh), _dims(args.shape)
    mesh = autoplan.fake_mesh(mesh_shape, tuple(f"a{i}" for i in range(len(mesh_shape))))
    model = RedistributeModel(mesh_shape, CollectiveModel(Topology()))
    run = move if args.via == "move" else redistribute
    pairs = [
        (src, dst)
        for src, dst in itertools.product(
            itertools.product(CHOICES, repeat=len(mesh_shape)), repeat=2
        )
        if any(isinstance(p, _StridedShard) for p in (*src, *dst))
    ]
    counts: Counter[str] = Counter()
    with LocalTensorMode(math.prod(mesh_shape)):
        flatten_mesh_groups(mesh)
        for src, dst in pairs:
            if model.steps(src, dst, shape, 4) is None:
                counts["priced impossible"] += 1
                continue
            what = f"{fmt(src)} -> {fmt(dst)}"
            try:
                ran, priced, out, x = run_move(mesh, model, src, dst, shape, run)
                right = right_values(mesh, out, x, dst)
            except Exception as err:  # noqa: BLE001 - a refused move is a finding here
                counts["raised"] += 1
                print(f"{what}: raised {type(err).__name__}: {str(err)[:90]}")
                continue
            if not right:
                counts["wrong values"] += 1
                print(f"{what}: wrong values")
            elif ran != priced:
                counts["other collectives"] += 1
                print(f"{what}: ran {ran}, priced {priced}")
            else:
                counts["as priced"] += 1
    print(f"{len(pairs)} moves on {args.mesh} via {args.via}: {dict(counts)}")


if __name__ == "__main__":
    main()
