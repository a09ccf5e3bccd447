"""autoplan changes no process-wide state a caller did not ask for: private torch modules
are imported by the adapter alone, and what ``plan()`` changes for its own speed it
restores (that importing registers nothing runs in a fresh interpreter, in
tests/integration/test_side_effects.py)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import torch
import torch.distributed.tensor._ops.utils as dtensor_op_utils
from torch.utils import flop_counter

import autoplan
from autoplan.models.mlp import TinyMLP
from tests.helpers.paths import REPO
from tests.helpers.planning import plan_mlp

ADAPTER = Path("autoplan/core/torch_adapter.py")


def test_private_torch_modules_are_imported_by_the_adapter_only():
    """No module but core/torch_adapter.py imports a private torch module, and none
    imports torch.testing."""
    offenders = []
    for path in sorted((REPO / "autoplan").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "torch":
                    continue
                private = any(part.startswith("_") for part in parts)
                if parts[1:2] == ["testing"] or private and path.relative_to(REPO) != ADAPTER:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    assert offenders == []


def _gc_and_registries() -> dict:
    return {
        "threshold": gc.get_threshold(),
        "enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
        "flop_formulas": dict(flop_counter.flop_registry),
        "redistribute_cost": dtensor_op_utils.redistribute_cost,
    }


def _plan_tiny() -> autoplan.Plan:
    with torch.device("meta"):
        model = TinyMLP(dim=16, hidden=32, n_layers=1)
    return plan_mlp(model, autoplan.fake_mesh((2,), ("dp",)), batch_shape=(4, 8, 16))


def test_plan_restores_the_gc_flop_registry_and_dtensor_costs():
    """After plan(): the same gc thresholds, gc enabled, nothing frozen, the same FLOP
    formulas and DTensor's own redistribute_cost."""
    before = _gc_and_registries()
    assert _plan_tiny().status == "optimal"
    after = _gc_and_registries()
    assert after["redistribute_cost"] is before.pop("redistribute_cost")
    after.pop("redistribute_cost")
    assert after == before


def test_plan_keeps_what_the_caller_froze_frozen():
    """Objects the caller moved to the permanent generation stay there after plan()."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _plan_tiny()
        # objects freed while planning leave the permanent generation; a thaw empties it
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
