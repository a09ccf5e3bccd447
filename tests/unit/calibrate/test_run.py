"""The calibration's public API: ``autoplan.calibrate`` and the options it shares with
``measure`` (autoplan.calibrate.run). The real calibration on gloo ranks is in
tests/integration/test_calibrate_run.py."""

from __future__ import annotations

import inspect

import pytest

import autoplan
from autoplan.calibrate.run import CalibrateOptions, measure


def test_calibrate_is_the_public_api():
    """autoplan.calibrate is the function, not the package of the same name."""
    assert autoplan.calibrate.__module__ == "autoplan.calibrate.run"
    assert callable(autoplan.calibrate)


def test_calibrate_takes_the_options_measure_takes():
    """calibrate's keyword options are measure's keyword-only parameters, name for name, and
    a misspelt one is refused before anything is measured."""
    params = inspect.signature(measure).parameters.values()
    keywords = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert list(CalibrateOptions.__annotations__) == keywords
    with pytest.raises(TypeError, match="forse"):
        autoplan.calibrate(None, forse=True)
