"""Pinned placements: the plan keeps them, twins stay free, mistakes are named."""

from __future__ import annotations

import pytest

from tests.helpers.planning import plan_pinned_llama

WQ0, WQ1 = "layers.0.attention.wq.weight", "layers.1.attention.wq.weight"


@pytest.mark.parametrize(
    ("pins", "needle"),
    [
        ({"layers.0.attention.wq.weigth": "RR"}, "closest: layers.0.attention.wq.weight"),
        ({WQ0: "S(2)R"}, "it can take: "),
        ({WQ0: "S(0)"}, "mesh has 2 axes"),
        ({WQ0: "X"}, "pins['layers.0.attention.wq.weight']"),
        ({"xs_1": "RR"}, "input or output placement constraint excludes"),
    ],
)
def test_bad_pins_are_named(pins, needle):
    """Unknown names, impossible or malformed placements and conflicts are ValueErrors."""
    with pytest.raises(ValueError) as info:
        plan_pinned_llama(pins)
    assert needle in str(info.value), str(info.value)
