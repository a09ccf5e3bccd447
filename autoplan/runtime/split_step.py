"""Stage 7, split: one recorded step's joint program cut into its forward, backward and
inference programs, and the values the forward hands the backward.

Input: the joint ``fx.GraphModule`` that :func:`autoplan.runtime.lower.lower` records (local aten
ops and functional collectives; placeholders ``primals_*`` then ``tangents_*``; outputs
the model's outputs then the gradients) and how many model outputs it has. Output: the
forward and backward programs (torch's default partitioner, cleaned of what it copies
for nothing), the forward alone for inference, and a :class:`SavedValue` per handed
value with where each backward placeholder comes from.

Why apart from the recording: where the step is cut decides what is held between the
forward and the backward and that no collective runs twice; these are checks on the
partitioner's output, a concern of their own.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import torch
from torch import fx

from autoplan.core.graph import forward_part
from autoplan.core.torch_adapter import partition_joint
from autoplan.runtime.bucket_program import impure_except_collectives

__all__ = [
    "SavedValue",
    "collective_ops",
    "forward_only",
    "placeholders",
    "saved_values",
    "split_joint",
]

_WAIT = torch.ops._c10d_functional.wait_tensor.default
_TANGENT = "tangents_"  # the partitioner's name for the cotangent placeholders


@dataclass(frozen=True)
class SavedValue:
    """A value the forward program hands to the backward program, on this rank."""

    name: str  # the forward program's node
    what: str  # "activation", or the placeholder it is (a parameter, buffer or input)
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def split_joint(gm: fx.GraphModule, num_outputs: int) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Torch's default partitioner on the joint local graph: the forward is what the
    outputs need (:func:`autoplan.core.graph.forward_part`), the rest is the backward."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    forward = forward_part(n for n in out.args[0][:num_outputs] if isinstance(n, fx.Node))
    for node in forward:
        node.meta["partitioner_tag"] = "is_forward"
    fwd, bwd = partition_joint(gm, num_outputs)
    for g in (fwd, bwd):
        # the partitioner copies into the backward every op its inputs can compute, and
        # keeps them though nothing reads them (a collective among them would run twice)
        g.graph.eliminate_dead_code(is_impure_node=impure_except_collectives)
    _hand_over_read_values(fwd, bwd, num_outputs)
    for g in (fwd, bwd):
        g.recompile()
    if collective_ops(fwd) + collective_ops(bwd) != collective_ops(gm):
        raise RuntimeError(
            "splitting the lowered step into forward and backward changed its collectives "
            f"({dict(collective_ops(gm))} became "
            f"{dict(collective_ops(fwd) + collective_ops(bwd))})"
        )
    return fwd, bwd


def _hand_over_read_values(fwd: fx.GraphModule, bwd: fx.GraphModule, num_outputs: int) -> None:
    """Stop handing over the saved values no backward op reads. The partitioner saves
    every forward collective's result that a backward node reads, counting the dead
    copies of forward ops it puts there: once they are gone, a weight a recomputed layer
    gathers again would be held through the backward for nothing."""
    unread = {p.name for p in placeholders(bwd) if not p.users and not p.name.startswith(_TANGENT)}
    if not unread:
        return
    out = next(n for n in reversed(fwd.graph.nodes) if n.op == "output")
    values = list(out.args[0])
    out.args = (values[:num_outputs] + [n for n in values[num_outputs:] if n.name not in unread],)
    for p in placeholders(bwd):
        if p.name in unread:
            bwd.graph.erase_node(p)
    fwd.graph.eliminate_dead_code(is_impure_node=impure_except_collectives)


def forward_only(forward: fx.GraphModule, num_outputs: int) -> fx.GraphModule:
    """The forward program returning the outputs only: what nothing else reads is dropped,
    collectives included."""
    graph = copy.deepcopy(forward.graph)
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    out.args = (tuple(out.args[0][:num_outputs]),)
    graph.eliminate_dead_code(is_impure_node=impure_except_collectives)
    return fx.GraphModule(forward, graph)


def saved_values(
    forward: fx.GraphModule, backward: fx.GraphModule, num_outputs: int, names: tuple[str, ...]
) -> tuple[tuple[SavedValue, ...], tuple[int, ...]]:
    """What the forward hands over, and where each backward placeholder comes from: its
    index among the saved values, or -k for the k-th cotangent (from 1)."""
    out = next(n for n in reversed(forward.graph.nodes) if n.op == "output")
    handed = list(out.args[0][num_outputs:])
    primal = {p.name: what for p, what in zip(placeholders(forward), names, strict=True)}
    saved = []
    for node in handed:
        val = node.meta["val"]
        saved.append(
            SavedValue(
                node.name,
                primal.get(node.name, "activation"),
                tuple(val.shape),
                val.dtype,
                val.numel() * val.element_size(),
            )
        )
    position = {n.name: i for i, n in enumerate(handed)}
    backward_inputs = []
    for p in placeholders(backward):
        if p.name.startswith(_TANGENT):
            backward_inputs.append(-int(p.name.removeprefix(_TANGENT)))  # tangents_1 -> -1
        elif p.name in position:
            backward_inputs.append(position[p.name])
        else:
            raise RuntimeError(f"backward program input {p.name} is not a saved forward value")
    return tuple(saved), tuple(backward_inputs)


def placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    """The program's inputs, in order."""
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def collective_ops(gm: fx.GraphModule) -> Counter[object]:
    """How many functional collectives of each op the program issues (waits not counted)."""
    return Counter(
        node.target.overloadpacket
        for node in gm.graph.nodes
        if getattr(node.target, "namespace", None) == "_c10d_functional"
        and node.target is not _WAIT
    )
