"""Hugging Face mixtures of experts in the capacity form (autoplan.models.hf_experts): with
room for every token they compute what transformers' eager experts do, tokens over
capacity skip an expert, and bad settings are refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from autoplan.core.errors import PlanError
from autoplan.models import hf, hf_experts

pytest.importorskip("transformers")

ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}
CONFIGS = {
    "mixtral": {"hidden_size": 32, "intermediate_size": 48, "num_local_experts": 4},
    "qwen3_moe": {"hidden_size": 32, "moe_intermediate_size": 24, "num_experts": 8},
    "qwen2_moe": {
        "hidden_size": 32,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40,
        "num_experts": 8,
    },
}


def _pair(kind: str, **settings) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights with transformers' eager experts and with the capacity form."""
    config = {"num_hidden_layers": 1, "num_experts_per_tok": 2, **ATTENTION, **CONFIGS[kind]}
    torch.manual_seed(0)
    ours = hf.build_hf(kind, config | settings, device="cpu")
    eager = copy.deepcopy(ours)
    eager.config._experts_implementation = "eager"
    return eager, ours


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_with_room_for_every_token_the_capacity_form_is_transformers_eager(kind):
    """capacity_factor = experts / top_k (no token dropped): the logits and every gradient
    equal those of transformers' eager experts loop."""
    experts = CONFIGS[kind].get("num_local_experts", CONFIGS[kind].get("num_experts"))
    eager, ours = _pair(kind, capacity_factor=experts / 2, group_size=16)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    want, got = eager(ids), ours(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want.pow(2).mean().backward()
    got.pow(2).mean().backward()
    for (name, p), q in zip(eager.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_tokens_over_capacity_skip_the_expert():
    """With one slot per expert and group, the output differs from eager's (tokens were
    dropped) and equals the one computed with every token past the first one of an
    expert left out."""
    eager, ours = _pair("mixtral", capacity_factor=0.01, group_size=8)
    hidden = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    index = torch.tensor([[0, 1], [0, 2], [1, 3], [2, 0], [3, 1], [0, 1], [2, 3], [1, 2]])
    weights = torch.rand(8, 2, generator=torch.Generator().manual_seed(3))
    layer = ours.model.layers[0].mlp.experts
    got = hf_experts.capacity_experts_forward(layer, hidden, index, weights)
    first: dict[int, tuple[int, int]] = {}  # expert -> the (token, choice) that gets its slot
    for choice in range(2):
        for token in range(8):
            first.setdefault(int(index[token, choice]), (token, choice))
    kept = torch.zeros_like(weights)
    for token, choice in first.values():
        kept[token, choice] = weights[token, choice]
    eager_layer = eager.model.layers[0].mlp.experts
    want = eager_layer(hidden, index, kept)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"capacity_factor": 0}, ["capacity_factor (0)", "positive number"]),
        ({"capacity_factor": "big"}, ["capacity_factor ('big')"]),
        ({"group_size": 0}, ["group_size (0)", "positive integer"]),
        ({"group_size": 2.5}, ["group_size (2.5)"]),
    ],
)
def test_bad_capacity_settings_are_refused_by_name(change, words):
    """A capacity setting out of range is a PlanError naming it, its value and the rule."""
    with pytest.raises(PlanError) as info:
        hf.make_config("mixtral", change)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_tokens_that_do_not_split_into_groups_are_refused_by_name():
    """batch x seq not a multiple of group_size: a PlanError naming group_size and the fix."""
    _, ours = _pair("mixtral", group_size=12)
    with pytest.raises(PlanError, match=r"group_size \(12\).*model.config.group_size"):
        ours(torch.randint(0, 64, (2, 8)))


def test_another_experts_implementation_is_planned_in_the_capacity_form_with_a_warning():
    """Asking for grouped_mm (or eager) warns and builds the capacity form, the only one
    that traces with static shapes and has sharding rules."""
    with pytest.warns(UserWarning, match="grouped_mm.*autoplan_capacity"):
        config = hf.make_config("mixtral", {"experts_implementation": "grouped_mm"})
    assert config._experts_implementation == hf_experts.NAME
    assert {"capacity_factor", "group_size"} <= set(hf.config_keys("qwen3_moe"))
    assert "capacity_factor" not in hf.config_keys("llama")
