"""Keyword inputs: ``input_fn`` returning a dict, planned per key, called as ``pm(**batch)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoplan
from autoplan.core.inputs import call_form, flatten_inputs, match_call
from autoplan.result.plan import Plan
from autoplan.runtime.apply import input_placements
from autoplan.trace.capture import trace_joint
from tests.helpers.planning import plan_model

VOCAB, DIM, BATCH, SEQ = 64, 32, 8, 16


class TinyLM(nn.Module):
    """Embedding, a projection to the vocabulary, and its own loss from ``labels``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
        logits = self.head(self.embed(input_ids))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))
        return {"loss": loss, "logits": logits}


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return {"input_ids": ids, "labels": ids.roll(-1, 1)}


def test_the_three_forms_flatten_with_their_keys():
    x, y = torch.zeros(2), torch.ones(3)
    assert flatten_inputs(x) == ((0,), (x,))
    assert flatten_inputs([x, y]) == ((0, 1), (x, y))
    assert flatten_inputs({"labels": y, "input_ids": x}) == (("labels", "input_ids"), (y, x))
    assert call_form(("a", "b"), [x, y]) == ((), {"a": x, "b": y})
    assert call_form((0, 1), [x, y]) == ((x, y), {})


@pytest.mark.parametrize(
    "value, message",
    [
        ({"input_ids": torch.zeros(2), "use_cache": False}, r"input 'use_cache' is a bool"),
        ({1: torch.zeros(2)}, r"dict with key 1: keys are the forward's keyword"),
        ((torch.zeros(2), 3.0), r"input 1 is a float, not a tensor"),
        ("ids", r"must be a tensor, a tuple of tensors or a dict of keyword tensors, got str"),
    ],
)
def test_what_is_not_a_tensor_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        flatten_inputs(value)


def test_a_call_is_matched_by_keyword_whatever_its_order():
    x, y = torch.zeros(2), torch.ones(3)
    assert match_call(("input_ids", "labels"), (), {"labels": y, "input_ids": x}) == (x, y)
    with pytest.raises(TypeError, match=r"keyword input 'mask', which the plan does not know"):
        match_call(("input_ids", "labels"), (), {"input_ids": x, "labels": y, "mask": x})
    with pytest.raises(TypeError, match=r"planned for keyword inputs input_ids, labels but got "):
        match_call(("input_ids", "labels"), (), {"input_ids": x})
    with pytest.raises(TypeError, match=r"planned for 1 positional input but got 2 positional"):
        match_call((0,), (x, y), {})


def test_a_dict_input_plans_with_its_keys_and_the_loss_replicated():
    """The plan records the keys; the scalar loss output is replicated (every rank reads
    the whole loss); the labels go where the one placement given for all inputs says."""
    plan = plan_model(
        TinyLM, _batch, autoplan.fake_mesh((2, 2), ("dp", "tp")), input_placements="S(0)R"
    )
    assert plan.status == "optimal"
    assert plan.input_keys == ("input_ids", "labels")
    assert plan.input_shapes == ((BATCH, SEQ), (BATCH, SEQ))
    assert [autoplan.core.placements.fmt(p) for p in input_placements(plan)] == ["S(0)R"] * 2
    loss_node = next(n for n, e in plan.node_placements.items() if e["op"].startswith("aten.nll"))
    assert plan.node_placements[loss_node]["out"][0] == "RR"
    again = Plan.from_json(plan.to_json())
    assert again.input_keys == ("input_ids", "labels")


def test_input_placements_by_key_fix_only_the_keys_given():
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp"))
    plan = plan_model(TinyLM, _batch, mesh, input_placements={"labels": "S(0)R"})
    assert autoplan.core.placements.fmt(input_placements(plan)[1]) == "S(0)R"
    with pytest.raises(ValueError, match=r"names input 'mask', which input_fn does not return"):
        plan_model(TinyLM, _batch, mesh, input_placements={"mask": "S(0)R"})


class WeightedLM(TinyLM):
    """Token ids (integer) and per-token loss weights (float), both keyword inputs."""

    def forward(self, input_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        nll = F.cross_entropy(logits.flatten(0, 1).float(), input_ids.flatten(), reduction="none")
        return (nll * weights.flatten()).mean()


def test_integer_and_float_keyword_inputs_plan_in_mixed_precision():
    """A float keyword input is cast with the parameters (FSDP2's cast_forward_inputs),
    the integer one is not; both are placed, the loss replicated."""
    with torch.device("meta"):
        model = WeightedLM()

    def batch():
        return {
            "input_ids": torch.randint(0, VOCAB, (BATCH, SEQ)),
            "weights": torch.rand(BATCH, SEQ),
        }

    plan = autoplan.plan(
        model,
        batch,
        autoplan.fake_mesh((4,), ("dp",)),
        input_placements="S(0)",
        config=autoplan.PlanConfig(param_dtype="bfloat16"),
    )
    assert plan.status == "optimal" and plan.input_keys == ("input_ids", "weights")
    assert [autoplan.core.placements.fmt(p) for p in input_placements(plan)] == ["S(0)", "S(0)"]
    traced = trace_joint(model, batch, param_dtype=torch.bfloat16)
    ids, weights = (traced.node(n) for n in traced.inputs)
    cast = [u for u in weights.users if u.target is torch.ops.aten._to_copy.default]
    assert [u.kwargs["dtype"] for u in cast] == [torch.bfloat16]
    assert not any(u.target is torch.ops.aten._to_copy.default for u in ids.users)
