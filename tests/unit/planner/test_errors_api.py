"""Bad input to the Python API: each raises a PlanError naming the thing and the fix.

The mistakes a user makes calling ``autoplan.plan``: arguments of the wrong kind
(:mod:`autoplan.planner.api_checks`), inputs the forward cannot take, outputs with no backward
and data-dependent ops (:mod:`autoplan.trace.forward_checks`), and ``PlanConfig`` values
(:mod:`autoplan.core.config`). Next to them, the forms that look alike and are accepted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DynamicOutputShapeException

import autoplan
from autoplan.trace.capture import mean_loss
from tests.helpers.bad_input import assert_plan_error

DIM = 8


class Linear(nn.Module):
    """One linear layer under the name ``l``."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


class Scaled(Linear):
    """A forward that takes a Python float next to its tensor."""

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.l(x) * scale


class KeywordOnly(Linear):
    """A forward with a keyword-only tensor argument."""

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return self.l(x) * mask


@dataclass
class Output:
    """A container torch's pytree does not know."""

    hidden: torch.Tensor


class Returns(Linear):
    """A forward returning ``make(hidden)``."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def forward(self, x: torch.Tensor):
        return self.make(self.l(x))


class Gate(nn.Module):
    """Keeps the positive entries: a data-dependent shape."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[torch.nonzero(h > 0, as_tuple=True)]


class Gated(Linear):
    """A linear layer followed by the data-dependent ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.l(x)).sum()


class Masked(Linear):
    """Boolean-mask indexing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l(x)
        return h[h > 0].sum()


class EagerExperts(nn.Module):
    """Experts run one by one on the tokens routed to each, as transformers' ``eager``
    experts do: which tokens an expert takes depends on the router's values."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, 4)
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            (rows,) = torch.where(chosen == e)
            out = out.index_add(0, rows, expert(x[rows]))
        return out


class SparseMoE(nn.Module):
    """A block holding the eager experts, under the name ``moe``."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = EagerExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x)


class Branches(Linear):
    """Python control flow on a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l(x)
        return h if h.sum().item() > 0 else -h


@torch.library.custom_op("autoplan_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    """A custom op with no fake implementation."""
    return x * 2


class CustomOp(Linear):
    """Calls an op fake tensors cannot run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return double(self.l(x))


class NoParams(nn.Module):
    """No parameters at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _x() -> torch.Tensor:
    return torch.randn(4, DIM)


def _raises() -> torch.Tensor:
    raise RuntimeError("no such file: batch.pt")


def _plan(model=None, input_fn=_x, mesh=None, **kwargs):
    """``autoplan.plan`` on the tiny linear model and a 2 x 2 mesh, unless told otherwise."""
    mesh = autoplan.fake_mesh((2, 2), ("dp", "tp")) if mesh is None else mesh
    return autoplan.plan(Linear() if model is None else model, input_fn, mesh, **kwargs)


# (what the user did, the call, the words the message must hold)
BAD_CALLS = [
    (
        "forward takes a float",
        lambda: _plan(Scaled(), lambda: (_x(), 2.0)),
        ["input 1 is a float", "wrapper module", "torch.tensor(2.0)"],
    ),
    (
        "keyword-only tensor passed by position",
        lambda: _plan(KeywordOnly(), lambda: (_x(), torch.ones(4, DIM))),
        ["keyword-only argument mask", "return a dict from input_fn", "'mask': ..."],
    ),
    (
        "forward returns an unknown container",
        lambda: _plan(Returns(Output)),
        ["returned no tensor (only Output)", "dict of tensors", "ModelOutput", "loss_fn="],
    ),
    (
        "forward returns None",
        lambda: _plan(Returns(lambda h: None)),
        ["returned no tensor", "wrap the model"],
    ),
    (
        "torch.nonzero",
        lambda: _plan(Gated()),
        [
            "aten.nonzero",
            "torch.nonzero",
            "module 'gate' (Gate)",
            "test_errors_api.py:",
            "torch.where",
        ],
    ),
    (
        "an eager experts loop",
        lambda: _plan(SparseMoE()),
        [
            "module 'moe' (EagerExperts)",
            "depends on tensor values",
            "capacity form",
            "autoplan.models.moe",
            "autoplan.models.hf",
        ],
    ),
    (
        "boolean-mask indexing",
        lambda: _plan(Masked()),
        ["boolean-mask indexing x[mask]", "fake tensors", "x * mask"],
    ),
    (
        "tensor read as a Python number",
        lambda: _plan(Branches()),
        [".item()", "depends on tensor values"],
    ),
    (
        "input_placements list of the wrong length",
        lambda: _plan(input_placements=["S(0)R", "RR"]),
        ["lists 2 placements for the model's 1 input", "one placement such as 'S(0)R' for all"],
    ),
    (
        "config given a dict",
        lambda: _plan(config={"mm_mode": "native"}),
        ["config must be an autoplan.PlanConfig", "dict", "PlanConfig(**d)"],
    ),
    (
        "mesh given a tuple",
        lambda: _plan(mesh=(2, 2)),
        ["mesh must be a DeviceMesh", "tuple (2, 2)", "autoplan.fake_mesh((2, 2), ('dp', 'tp'))"],
    ),
    (
        "input_fn given a tensor",
        lambda: _plan(input_fn=torch.randn(4, DIM)),
        ["input_fn must be a function", "Tensor of shape [4, 8]", "lambda: x"],
    ),
    (
        "input_fn given None",
        lambda: _plan(input_fn=None),
        ["input_fn must be a function", "NoneType"],
    ),
    (
        "no trainable parameters",
        lambda: _plan(NoParams()),
        ["NoParams has no trainable parameters", "nn.Parameter"],
    ),
    (
        "only an integer output",
        lambda: _plan(Returns(lambda h: h.argmax(-1))),
        ["only integer tensors", "torch.int64", "not their argmax", "loss_fn="],
    ),
    (
        "model is a function",
        lambda: _plan(lambda x: x),
        ["model must be a torch.nn.Module", "function <lambda>", "wrap a function in a module"],
    ),
    (
        "model is the class, not an instance",
        lambda: _plan(Linear),
        ["model is the class Linear", "model=Linear(...)"],
    ),
    (
        "placement with fewer entries than mesh axes",
        lambda: _plan(input_placements=["S(0)"]),
        ["input_placements[0]", "1 entries but the mesh has 2 axes"],
    ),
    (
        "placement that does not parse",
        lambda: _plan(input_placements="S0R"),
        ["input_placements[0]", "'S0R' does not parse", "S(d)"],
    ),
    (
        "input_placements of the wrong kind",
        lambda: _plan(input_placements=0),
        ["input_placements must be", "got int 0", "'S(0)R'"],
    ),
    (
        "input_placements keyed by an unknown input",
        lambda: _plan(input_placements={"ids": "S(0)R"}),
        ["names input 'ids'", "key the dict by input_fn's keys"],
    ),
    (
        "output_placements of the wrong length",
        lambda: _plan(output_placements=["S(0)R", "RR"]),
        ["output_placements lists 2 placements for the model's 1 output tensor"],
    ),
    (
        "pins naming an unknown parameter",
        lambda: _plan(pins={"l.wieght": "RR"}),
        ["'l.wieght' is neither a parameter", "closest: l.weight"],
    ),
    (
        "pins given a list of pairs",
        lambda: _plan(pins=[("l.weight", "RR")]),
        ["pins must be a dict", "got list"],
    ),
    (
        "pins to a placement the parameter cannot take",
        lambda: _plan(pins={"l.weight": "S(5)R"}),
        ["pins['l.weight'] = S(5)R", "it can take: RR"],
    ),
    (
        "input_fn raises",
        lambda: _plan(input_fn=_raises),
        ["input_fn raised RuntimeError", "test_errors_api.py:", "no such file: batch.pt"],
    ),
    (
        "input_fn takes an argument",
        lambda: _plan(input_fn=lambda n: torch.randn(n, DIM)),
        ["input_fn(n) is called with no arguments", "lambda: make_batch(8)"],
    ),
    (
        "input_fn returns nothing the forward needs",
        lambda: _plan(input_fn=lambda: ()),
        ["Linear.forward(x)", "no inputs", "missing a required argument: 'x'"],
    ),
    (
        "input of the wrong shape",
        lambda: _plan(input_fn=lambda: torch.randn(4, DIM - 1)),
        ["raised RuntimeError in module 'l' (Linear)", "input 0: [4, 7] float32", "shapes"],
    ),
    (
        "custom op with no fake implementation",
        lambda: _plan(CustomOp()),
        ["raised RuntimeError", "autoplan_test::double", "torch.library.register_fake"],
    ),
    (
        "loss_fn not callable",
        lambda: _plan(loss_fn="mean"),
        ["loss_fn must be a function", "str 'mean'", "lambda out:"],
    ),
    (
        "loss_fn returns a float",
        lambda: _plan(loss_fn=lambda out: 1.0),
        ["loss_fn returned float 1.0, not a tensor"],
    ),
    (
        "loss_fn fails on a dict output",
        lambda: _plan(Returns(lambda h: {"logits": h}), loss_fn=mean_loss),
        ["loss_fn raised AttributeError", "a dict with keys logits", "out['logits']"],
    ),
    (
        "progress not callable",
        lambda: _plan(progress="yes"),
        ["progress must be a function", "progress=print"],
    ),
]


@pytest.mark.parametrize("call, words", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_a_bad_call_names_the_fix(call, words):
    """Each bad call to plan() raises a PlanError with the thing, its value and the fix."""
    assert_plan_error(call, *words)


BAD_CONFIGS = [
    ({"memory_budget_gib": -1}, ["memory_budget_gib (-1)", "not positive", "> 0, or None"]),
    ({"memory_budget_gib": float("nan")}, ["memory_budget_gib (nan)", "finite number > 0"]),
    ({"memory_budget_gib": float("inf")}, ["memory_budget_gib (inf)", "> 0, or None"]),
    ({"memory_budget_gib": "40"}, ["memory_budget_gib ('40')", "not a number"]),
    ({"time_limit_s": float("inf")}, ["time_limit_s (inf)", "> 0, or None"]),
    ({"time_limit_s": float("nan")}, ["time_limit_s (nan)", "finite number > 0"]),
    ({"time_limit_s": True}, ["time_limit_s (True)", "not a number"]),
    ({"mip_gap": 1}, ["mip_gap (1)", ">= 0 and < 1"]),
    ({"mip_gap": -0.1}, ["mip_gap (-0.1)", ">= 0 and < 1"]),
    ({"mip_gap": True}, ["mip_gap (True)", "not a number"]),
    ({"mm_mode": "einsun"}, ["mm_mode ('einsun')", '"einsum", "native"']),
    ({"solver": "gurobi"}, ["solver ('gurobi')", '"cbc", "highs"']),
    ({"optimizer_states": True}, ["optimizer_states (True)", "integer >= 0"]),
    ({"optimizer_states": 1.5}, ["optimizer_states (1.5)", "integer >= 0"]),
    ({"bucket_mib": -1}, ["bucket_mib (-1)", "negative", ">= 0"]),
    ({"activation_checkpointing": "yes"}, ["activation_checkpointing ('yes')", "selective"]),
    ({"param_dtype": "bf16"}, ["param_dtype ('bf16')", "bfloat16", "or None"]),
    ({"routes": "yes"}, ["routes ('yes')", "True or False"]),
    ({"topology": "h100"}, ["topology ('h100')", "Topology.preset"]),
]


@pytest.mark.parametrize("fields, words", BAD_CONFIGS, ids=[str(c[0]) for c in BAD_CONFIGS])
def test_a_bad_config_field_names_the_rule(fields, words):
    """A PlanConfig field of the wrong type or value names the field, value and rule."""
    assert_plan_error(lambda: autoplan.PlanConfig(**fields), *words)


def test_a_trace_error_chains_the_torch_exception():
    """The PlanError for a data-dependent op keeps torch's exception as its cause."""
    with pytest.raises(autoplan.PlanError) as info:
        _plan(Gated())
    assert isinstance(info.value.__cause__, DynamicOutputShapeException)


def test_a_failed_op_logs_no_traceback(caplog):
    """An op failing on input_fn's shapes is reported once, as the PlanError: fake
    tensor mode's logged traceback is dropped."""
    with caplog.at_level(logging.DEBUG):
        assert_plan_error(lambda: _plan(input_fn=lambda: torch.randn(4, DIM - 1)), "[4, 7]")
    assert "Traceback" not in caplog.text
    assert "failed while attempting" not in caplog.text


@pytest.mark.parametrize(
    "model, kwargs",
    [
        (Linear(), {"input_placements": "S(0)R"}),
        (Linear(), {"input_placements": ("S(0)R",)}),
        (Linear(), {"input_placements": ["S(0)R"], "output_placements": "S(0)R"}),
        (KeywordOnly(), {"input_placements": "S(0)R"}),
        (Returns(lambda h: {"loss": h.float().mean(), "logits": h}), {}),
        (Returns(lambda h: {"logits": h}), {"loss_fn": lambda out: out["logits"].mean()}),
    ],
    ids=[
        "one placement string",
        "tuple of strings",
        "one output placement string",
        "keyword-only from a dict",
        "dict output with a loss",
        "dict output with loss_fn",
    ],
)
def test_the_forms_that_look_alike_plan(model, kwargs):
    """What the bad calls are near to is accepted: a placement string or tuple for the
    inputs, keyword inputs from a dict, a dict output."""
    input_fn = (
        (lambda: {"x": _x(), "mask": torch.ones(4, DIM)}) if isinstance(model, KeywordOnly) else _x
    )
    plan = _plan(model, input_fn, **kwargs)
    assert plan.status == "optimal"


def test_a_model_output_plans():
    """A Hugging Face ModelOutput with a loss plans like a dict."""
    outputs = pytest.importorskip("transformers.modeling_outputs")
    model = Returns(lambda h: outputs.CausalLMOutput(loss=h.float().mean(), logits=h))
    assert _plan(model).status == "optimal"
