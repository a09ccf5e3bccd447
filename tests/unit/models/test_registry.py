"""The model registry: each kind a run file names builds, makes its inputs, says its
limits, and refuses what it cannot build by name."""

import pytest

from autoplan.core.errors import PlanError
from autoplan.models import TinyMLP, Transformer
from autoplan.models.registry import model_kind


def test_the_registry_builds_each_reference_kind_with_its_inputs_and_limits():
    llama = model_kind("llama3")
    args = {"dim": 64, "n_layers": 1, "n_heads": 4, "vocab_size": 96, "max_seq_len": 48}
    assert isinstance(llama.build(args), Transformer)
    assert llama.inputs(args, 3, 5)().shape == (3, 5)
    assert int(llama.inputs(args, 64, 64)().max()) < 96
    assert llama.seq_limit(args)[0] == 48
    mlp = model_kind("mlp")
    assert set(mlp.keys()) == {"dim", "hidden", "n_layers"}
    built = mlp.build({"dim": 16, "n_layers": 3})
    assert isinstance(built, TinyMLP) and len(built.layers) == 3
    assert next(built.parameters()).device.type == "meta"
    assert mlp.inputs({"dim": 16}, 2, 7)().shape == (2, 7, 16)
    assert mlp.seq_limit({}) is None


def test_the_registry_refuses_unknown_kinds_and_bad_arguments_by_name():
    with pytest.raises(PlanError, match="'gpt5' is not known; allowed: llama3, moe, mlp, hf:"):
        model_kind("gpt5")
    with pytest.raises(PlanError, match="hidden"):
        model_kind("mlp").check({"hidden": 0})
    with pytest.raises(PlanError, match="unexpected keyword argument 'width'"):
        model_kind("llama3").check({"width": 3})
