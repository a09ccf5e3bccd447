"""Which ops the strategies stage treats apart, and which layouts involve _StridedShard.

Used by stage 3 (:mod:`autoplan.strategies.enumerate`) and by the read-out of a plan
(:mod:`autoplan.planner.readout`). Input: aten ops and strategies. Output: the op sets and
predicates below.

``FREE_OPS`` are views and aliases: no kernel runs, so they cost no compute, and
they are the ops that make ``_StridedShard`` (by flattening a dim sharded on two
axes). ``MM_FAMILY`` is the mm family whose single-dim rules are filled with the
split factors seen on their inputs in native mode.
"""

from __future__ import annotations

import torch

from autoplan.core.placements import Placements, is_strided, sharded_dim
from autoplan.strategies.table import Strategy

aten = torch.ops.aten

FREE_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.t.default,
        aten.transpose.int,
        aten.permute.default,
        aten.expand.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.alias.default,
        aten.detach.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.split.Tensor,
        aten.unbind.int,
    }
)


MM_FAMILY = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten._scaled_mm.default,
    }
)


def has_strided(s: Strategy) -> bool:
    """Whether any placement of strategy ``s`` is a ``_StridedShard``."""
    return any(is_strided(p) for ps in (*s.outs, *s.ins) if ps is not None for p in ps)


def strided_after_shard(placements: Placements) -> bool:
    """A dim sharded on one axis and strided-sharded on a later one.

    torch 2.13's view rules mis-propagate this layout (the values they claim
    for the output are not the ones the shards hold: see
    tests/integration/test_strategy_execution.py), so views do not accept it.
    """
    seen: set[int] = set()
    for p in placements:
        d = sharded_dim(p)
        if d is None:
            continue
        if is_strided(p) and d in seen:
            return True
        seen.add(d)
    return False
