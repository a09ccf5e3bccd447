"""The groups a calibration measures are the ones plans run collectives on: each axis,
then runs of consecutive axes, axes of size 1 left out (autoplan.calibrate.groups)."""

from __future__ import annotations

import pytest

from autoplan.calibrate.groups import axis_runs, group_ranks, measured_axes


def test_axis_runs_are_the_groups_plans_use():
    """Single axes, then runs of consecutive axes, the whole mesh last."""
    assert axis_runs(1) == [(0,)]
    assert axis_runs(2) == [(0,), (1,), (0, 1)]
    assert axis_runs(3) == [(0,), (1,), (2,), (0, 1), (1, 2), (0, 1, 2)]


@pytest.mark.parametrize(
    "axes, expected",
    [
        ((2,), [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]),
        ((0,), [[0, 6], [1, 7], [2, 8], [3, 9], [4, 10], [5, 11]]),
        ((1, 2), [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]),
        ((0, 1), [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]),
        ((0, 2), [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]),
        ((0, 1, 2), [list(range(12))]),
    ],
)
def test_group_ranks_of_a_row_major_mesh(axes, expected):
    """On a (2, 3, 2) mesh of ranks 0..11 laid out row-major (last axis fastest), the
    groups over some axes vary those axes and fix the others."""
    assert sorted(group_ranks((2, 3, 2), axes)) == expected


def test_axes_of_size_one_are_left_out():
    """A (1, 4) mesh is measured on its 4-rank axis once; (2, 1, 2) on each axis of 2
    and on both together (a run through the axis of 1); a single rank on nothing."""
    assert measured_axes((2, 2)) == [(0,), (1,), (0, 1)]
    assert measured_axes((1, 4)) == [(1,)]
    assert measured_axes((2, 1, 2)) == [(0,), (2,), (0, 2)]
    assert measured_axes((1,)) == []
