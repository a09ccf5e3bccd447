"""autoplan changes no process-wide state a caller did not ask for: importing it registers
nothing, and what ``plan()`` changes for its own speed it restores."""

from __future__ import annotations

import pytest

from tests.helpers.isolated import run_isolated

# What an import could register: torch's FLOP formulas, transformers' attention
# implementations and mask functions, a process group.
_REGISTRIES = """
import importlib, json, pkgutil
import torch.distributed as dist
from torch.utils import flop_counter
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

def registries():
    return {
        "flop_formulas": {str(k): id(v) for k, v in flop_counter.flop_registry.items()},
        "attention": sorted(AttentionInterface()),
        "attention_masks": sorted(AttentionMaskInterface()),
        "process_group": dist.is_initialized(),
    }

before = registries()
import autoplan
for module in pkgutil.walk_packages(autoplan.__path__, "autoplan."):
    importlib.import_module(module.name)
print(json.dumps([before, registries()]))
"""


def test_importing_every_autoplan_module_registers_nothing():
    """In a fresh interpreter, importing all of autoplan leaves torch's FLOP registry,
    transformers' attention registries and the process groups as they were."""
    pytest.importorskip("transformers")
    before, after = run_isolated(_REGISTRIES)
    assert after == before
