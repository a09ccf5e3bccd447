"""Values made once per distinct operands, told apart by identity, for the stages that
derive arrays from the cost table (the follower merging, the layer modes).

Input: a tag, the operands and how to make the value from them. Output: the value made
for the first call with that tag and those operands (the same objects), at every call.

Why: twin layers' nodes and edges hold the same arrays from the cost stage (priced once
per distinct question), and what a stage derives from them is then the same array too:
made once, it costs one layer's bytes and time, not every layer's. Operands are told
apart by identity, not by value (hashing them would read every array), so the memo holds
them: no id is reused while it lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["ByIdentity"]

T = TypeVar("T")


class ByIdentity:
    """A memo of values by a tag and their operands' identities (see the module docstring);
    it lives as long as the stage that asks it."""

    def __init__(self) -> None:
        self._made: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}

    def made(self, tag: Hashable, operands: tuple[Any, ...], make: Callable[[], T]) -> T:
        """The value ``make()`` gave at the first call with ``tag`` and these operands."""
        key = (tag, *map(id, operands))
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = (make(), operands)
        return found[0]
