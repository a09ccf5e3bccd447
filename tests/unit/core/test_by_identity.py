"""ByIdentity: values made once per tag and operands, told apart by identity."""

from __future__ import annotations

import numpy as np

from autoplan.core.by_identity import ByIdentity


def test_the_same_operands_give_the_value_made_first_and_others_their_own():
    memo = ByIdentity()
    a = np.arange(4)
    calls = []

    def doubled(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return x * 2

    first = memo.made("doubled", (a,), lambda: doubled(a))
    assert memo.made("doubled", (a,), lambda: doubled(a)) is first
    assert memo.made("other", (a,), lambda: doubled(a)) is not first  # another tag
    assert memo.made("doubled", (a.copy(),), lambda: doubled(a)) is not first  # equal, not a
    assert len(calls) == 3


def test_an_operand_is_held_so_its_id_is_not_reused():
    """Operands made and dropped in a loop: without the memo holding them, a new array
    could take a dropped one's id and be handed the dropped one's value."""
    memo = ByIdentity()
    for k in range(50):
        a = np.full(3, k)
        assert memo.made("plus", (a,), lambda a=a: a + 1)[0] == k + 1
        del a
