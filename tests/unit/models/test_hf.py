"""Hugging Face models (autoplan.models.hf): run files with ``model.hf`` build on meta with
Hugging Face's names, trace and are refused by name when wrong. Planning them through
run files and executing plans on gloo ranks is in tests/integration/test_hf.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autoplan.models import hf
from autoplan.tools.cli import main
from autoplan.tools.runfile import RunFileError, load_run
from autoplan.trace.capture import trace_joint
from tests.helpers.paths import CONFIGS

pytest.importorskip("transformers")


GPT2 = CONFIGS / "hf_gpt2_tiny.yaml"


CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def test_model_is_on_meta_with_hf_parameter_names():
    """The model is the HF class on the meta device, with HF's parameter names."""
    model = hf.build_hf("llama", {"num_hidden_layers": 1, "hidden_size": 32, "vocab_size": 64})
    names = [n for n, _ in model.named_parameters()]
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.config.use_cache is False and model.config._attn_implementation == hf.SDPA


def test_forward_returns_logits():
    """forward(input_ids) returns the logits tensor, the same as HF's own output's logits."""
    config = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64}
    torch.manual_seed(0)
    model = hf.build_hf("gpt2", config, device="cpu")
    x = torch.randint(0, 64, (2, 8))
    out = model(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 8, 64)
    plain = type(model).__mro__[1].forward(model, input_ids=x).logits
    assert torch.equal(out, plain)


def test_set_overrides_hf_config_key():
    """--set model.config.n_layer=3 reaches the HF config and the built model."""
    run = load_run(GPT2, ["model.config.n_layer=3"])
    assert run.model_args["n_layer"] == 3
    assert len(run.build_model().transformer.h) == 3


def test_inputs_are_token_ids_below_vocab():
    """Inputs are (batch, seq) int64 token ids drawn below the config's vocab_size."""
    run = load_run(GPT2, ["model.config.vocab_size=96"])
    x = run.input_fn()()
    assert x.shape == (8, 32) and x.dtype == torch.int64
    assert int(x.max()) < 96


def _flash_kwargs(kind: str, config: dict) -> list[dict]:
    model = hf.build_hf(kind, config)
    traced = trace_joint(model, lambda: torch.randint(0, 64, (2, 16)))
    return [
        n.normalized_arguments(traced.gm, normalize_to_only_use_kwargs=True).kwargs
        for n in traced.gm.graph.nodes
        if str(n.target) == CPU_FLASH
    ]


def test_attention_is_causal_without_a_mask():
    """The traced attention is SDPA with is_causal and no materialized mask, as in eager training."""
    small = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64}
    calls = _flash_kwargs("gpt2", small)
    assert len(calls) == 2
    assert all(c.get("is_causal") is True and c.get("attn_mask") is None for c in calls)


def test_sliding_window_shorter_than_seq_keeps_its_mask():
    """A Mistral window shorter than the sequence is not plain causal: the mask stays."""
    small = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2}
    small |= {"num_key_value_heads": 1}
    assert _flash_kwargs("mistral", small | {"vocab_size": 64})[0].get("attn_mask") is None
    windowed = _flash_kwargs("mistral", small | {"vocab_size": 64, "sliding_window": 4})
    assert windowed[0].get("attn_mask") is not None


def test_untraceable_attention_is_switched_with_a_warning():
    """attn_implementation=flash_attention_2 is replaced by SDPA, with a warning naming it."""
    with pytest.warns(UserWarning, match="flash_attention_2.*autoplan_sdpa"):
        model = hf.build_hf("gpt2", {"n_layer": 1, "attn_implementation": "flash_attention_2"})
    assert model.config._attn_implementation == hf.SDPA
    eager = hf.build_hf("gpt2", {"n_layer": 1, "attn_implementation": "eager"})
    assert eager.config._attn_implementation == "eager"


def _write(tmp_path: Path, model: str, inputs: str = "{batch: 8, seq: 32}") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(f"""
        model: {model}
        inputs: {inputs}
        mesh: {{shape: [2, 2], names: [dp, tp]}}
        """)
    )
    return path


@pytest.mark.parametrize(
    "model, inputs, message",
    [
        ("{hf: bert}", None, r'model\.hf = "bert".*one of "gpt2", "llama", "qwen2", "mistral"'),
        (
            "{hf: gpt2, config: {n_layers: 2}}",
            None,
            r"unknown key model\.config\.n_layers.*n_layer,",
        ),
        ("{hf: llama, config: {hidden_size: 65}}", None, r"model\.config.*hidden size \(65\)"),
        ("{hf: gpt2, config: {n_embd: x}}", None, r"model\.config.*n_embd.*expected int"),
        (
            "{hf: mistral, config: {num_attention_heads: 4, num_key_value_heads: 3}}",
            None,
            r"model\.config: num_key_value_heads \(3\) must divide num_attention_heads \(4\)",
        ),
        ("{hf: gpt2, config: [1, 2]}", None, r"model\.config = \[1, 2\].*mapping"),
        ("{hf: gpt2, name: llama3}", None, r"model\.name cannot be combined with model\.hf"),
        ("{name: llama3, config: {}}", None, r"model\.config belongs to a Hugging Face model"),
        (
            "{hf: gpt2, config: {n_positions: 16}}",
            "{batch: 8, seq: 32}",
            r"inputs\.seq = 32.*at most 16.*n_positions",
        ),
    ],
)
def test_bad_hf_run_file_is_a_clear_error(tmp_path, model, inputs, message):
    """Each bad HF model section gives a RunFileError naming the file, the key and the fix."""
    path = _write(tmp_path, model, inputs or "{batch: 8, seq: 32}")
    with pytest.raises(RunFileError, match=message) as info:
        load_run(path)
    assert str(path) in str(info.value)


def test_config_a_layer_rejects_is_a_clear_error(tmp_path):
    """A config GPT2Config accepts but its attention rejects (65 dims, 4 heads) names the file."""
    run = load_run(_write(tmp_path, "{hf: gpt2, config: {n_embd: 65, n_head: 4}}"))
    with pytest.raises(RunFileError, match=r"run\.yaml: model\.config: GPT2LMHeadModel.*65"):
        run.build_model()


def test_missing_transformers_says_how_to_install(tmp_path, monkeypatch):
    """Without transformers installed, the error says pip install -e '.[hf]'."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(RunFileError, match=r"pip install -e '\.\[hf\]'"):
        load_run(_write(tmp_path, "{hf: gpt2}"))


def test_cli_validate_hf_config(capsys):
    """autoplan validate on the HF gpt2 config reports the model and its parameter count."""
    assert main(["validate", str(GPT2)]) == 0
    assert "model: hf:gpt2, 112,384 parameters" in capsys.readouterr().out
