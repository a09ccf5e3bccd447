"""FLOP counts per aten op, from ``torch.utils.flop_counter``'s formula registry.

autoplan prices compute with torch's own formulas (``mm``, ``bmm``, ``addmm``,
attention, convolution ...) instead of a parallel counter. torch has no
formula for ``aten.einsum``, which the ``mm_mode="einsum"`` rewrite produces
for every Linear, so :func:`op_flops` adds one: it reads torch's registry
first and falls back to autoplan's own (``_FORMULAS``), so a formula torch
or someone else registers for einsum wins.

autoplan never writes into torch's registry: the registry is process-wide, and
nothing outside :func:`op_flops` would read an einsum entry anyway.
``FlopCounterMode`` never sees ``aten.einsum`` when a graph runs: einsum is a
CompositeImplicitAutograd op and reaches dispatch modes already decomposed
into ``bmm``. The formula agrees with what the mode counts for the
decomposition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch.utils import flop_counter

__all__ = ["einsum_flop", "op_flops"]

aten = torch.ops.aten


def einsum_flop(
    equation: str,
    tensors: Sequence[Sequence[int]],
    *args: Any,
    path: Sequence[int] | None = None,
    out_shape: Sequence[int] | None = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten.einsum(equation, tensors, path=path)`` given operand shapes.

    Operands are contracted pairwise, left to right, or in the order of
    ``path`` (flattened ``opt_einsum`` pairs, as ``torch.einsum`` passes it);
    each pairwise contraction costs ``2 * prod(size of every letter of the
    pair)``, counting a multiply-add as two FLOPs like torch's ``mm`` formula.
    For two operands that is ``2 * prod(all letters)``: the forward
    ``"abk,kn->abn"`` and the backward ``"abn,nk->abk"``, ``"abn,abk->nk"``
    all cost ``2 * prod(batch) * K * N``. A letter found in one operand only
    and not in the output is counted too, an upper bound (torch sums it out
    first). A single operand (a sum, a diagonal, a permute) costs 0, as torch
    counts reductions.
    """
    inputs, output, sizes = _parse(equation.replace(" ", ""), tensors)
    if len(inputs) < 2:
        return 0
    pairs = list(zip(path[::2], path[1::2], strict=True)) if path else [(0, 1)] * (len(inputs) - 1)
    operands = inputs
    flops = 0
    for i, j in pairs:
        both = operands[i] | operands[j]
        rest = [op for idx, op in enumerate(operands) if idx not in (i, j)]
        flops += 2 * math.prod(sizes[c] for c in both)
        operands = [*rest, both & output.union(*rest)]
    return flops


def _parse(
    equation: str, shapes: Sequence[Sequence[int]]
) -> tuple[list[set[str]], set[str], dict[str, int]]:
    """Letters of each operand and of the output, and the size of each letter.

    Ellipsis dims become letters ``"..1"``, ``"..2"``, ... counted from the
    right, so broadcasting lines them up; sizes broadcast (size 1 loses).
    """
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(
            f"einsum equation {equation!r} has {len(terms)} operands, got {len(shapes)} shapes"
        )
    inputs: list[set[str]] = []
    ellipsis: set[str] = set()
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        head, dots, tail = term.partition("...")
        num_ellipsis = len(shape) - len(head) - len(tail) if dots else 0
        letters = [*head, *(f"..{i}" for i in range(num_ellipsis, 0, -1)), *tail]
        for letter, size in zip(letters, shape, strict=True):
            if sizes.get(letter, 1) == 1:
                sizes[letter] = int(size)
        inputs.append(set(letters))
        ellipsis.update(letters[len(head) : len(head) + num_ellipsis])
    if arrow:
        output = set(rhs.replace("...", "")) | (ellipsis if "..." in rhs else set())
    else:  # implicit output: letters used exactly once, plus the ellipsis dims
        used = [c for c in lhs if c.isalpha()]
        output = {c for c in used if used.count(c) == 1} | ellipsis
    return inputs, output, sizes


# Formulas for ops torch's registry lacks, wrapped as torch's register_flop_formula
# wraps them (tensors become shapes), so both tables are called alike.
_FORMULAS: Mapping[Any, Any] = MappingProxyType(
    {aten.einsum: flop_counter.shape_wrapper(einsum_flop)}
)


def op_flops(op: Any, args: Sequence[Any], kwargs: dict[str, Any] | None, out: Any) -> int:
    """FLOPs of one call ``op(*args, **kwargs) -> out`` by torch's registered formula.

    ``op`` is an ``OpOverload`` (``aten.mm.default``) or its packet
    (``aten.mm``). ``args``, ``kwargs`` and ``out`` hold what the op took and
    returned: tensors (real, fake or meta), or any object with a ``.shape``
    (e.g. fx ``TensorMetadata``) where a tensor was, nested in lists and
    tuples as the op's schema has them. Shape objects suffice for the
    shape-based formulas (matmuls, convolutions, einsum); attention formulas
    registered raw need tensors. Ops without a formula cost 0.
    """
    packet = getattr(op, "overloadpacket", op)
    formula = flop_counter.flop_registry.get(packet) or _FORMULAS.get(packet)
    if formula is None:
        return 0

    args = tuple(_as_shapes(a) for a in args)
    kwargs = {k: _as_shapes(v) for k, v in (kwargs or {}).items()}
    return int(formula(*args, **kwargs, out_val=_as_shapes(out)))


def _as_shapes(x: Any) -> Any:
    """Tensors stay (formulas take their shapes); other ``.shape`` carriers become sizes."""
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "shape"):
        return torch.Size(x.shape)
    if isinstance(x, list):
        return [_as_shapes(v) for v in x]
    if isinstance(x, tuple) and not isinstance(x, torch.Size):
        return tuple(_as_shapes(v) for v in x)
    return x
