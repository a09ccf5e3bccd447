"""Hugging Face ``transformers`` causal LMs as planning inputs: a config dict -> a meta model.

Input: a model kind (``gpt2``, ``llama``, ``qwen2``, ``mistral``, and the mixtures of
experts ``mixtral``, ``qwen2_moe``, ``qwen3_moe``) and a mapping of that
kind's config fields (``GPT2Config``, ``LlamaConfig``, ...). Output: the ``...ForCausalLM``
model on the meta device (no weights, no hub access), whose ``forward(input_ids)``
returns only the logits (what run files plan: one tensor in, the logits out), or with
``logits_only=False`` the Hugging Face class itself, planned from a dict ``input_fn``
(``input_ids=``, ``labels=``) and trained on the loss it computes.

Why a subclass and not a wrapper module: the subclass keeps the Hugging Face parameter
names (``model.layers.0.self_attn.q_proj.weight``), so a plan made here names the same
parameters as the user's own ``LlamaForCausalLM`` and can be applied to it.

Choices made for the trace, not by the user:

- ``attn_implementation`` is SDPA (``eager`` if the class has no SDPA path). Flash,
  flex and paged kernels cannot run on fake CPU tensors; a config asking for one is
  switched, with a warning. ``eager`` may be asked for explicitly.
- A mixture of experts runs its experts in the capacity form
  (:mod:`autoplan.models.hf_experts`, ``experts_implementation="autoplan_capacity"``),
  the one that traces with static shapes and shards by expert; ``capacity_factor`` and
  ``group_size`` in the config set its capacity (tokens over it skip an expert, as in
  :mod:`autoplan.models.moe`).
- ``use_cache=False``: training has no KV cache.
- GPT-2's three dropouts default to 0 (large-model pretraining runs without dropout; a
  traced dropout adds random ops and keeps SDPA off its fused kernel). Set
  ``resid_pdrop`` etc. to plan with dropout.
- Special token ids default to ``None``: they do not change the forward pass, and the
  hub defaults (e.g. GPT-2's 50256) are out of range for a tiny test vocabulary.

The SDPA used is ``transformers``' own, registered under the name ``autoplan_sdpa``
(by :func:`build_hf` and :func:`prepare`, never at import) with one change to its
mask. In eager training on unpadded, unpacked batches (what autoplan plans: token ids,
no attention mask) ``transformers`` reads the position ids, sees no packed sequences
and calls SDPA with ``is_causal=True`` and no mask, which is what runs flash attention
on a GPU. On fake tensors it cannot read them, so it would
build an explicit (batch, 1, seq, seq) mask and pass it to SDPA: a graph that training
does not run, and one whose attention DTensor has no sharding rule for (it would be
planned replicated). The ``autoplan_sdpa`` mask function returns no mask exactly when
the mask would be plain causal; padded, offset or windowed cases build it as before.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoplan.core.errors import PlanError
from autoplan.models import hf_experts

if TYPE_CHECKING:  # an optional dependency ([hf]): imported at run time only when used
    from transformers import PreTrainedModel

KINDS: dict[str, tuple[str, str]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}
MOE_KINDS = ("mixtral", "qwen2_moe", "qwen3_moe")  # planned with hf_experts' capacity form
SDPA = "autoplan_sdpa"
GPT2_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class HFConfigError(PlanError):
    """A Hugging Face model kind or config that cannot be built; the message says how to fix it."""


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise HFConfigError(
            "Hugging Face models need the optional 'transformers' package; "
            "install it with: pip install -e '.[hf]'"
        ) from exc


def _causal_mask(
    *,
    q_length: int,
    kv_length: int,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    q_offset: int = 0,
    **kwargs: Any,
) -> torch.Tensor | None:
    """``sdpa_mask``, except ``None`` (SDPA's ``is_causal``) for a plain causal mask."""
    from transformers.masking_utils import sdpa_mask

    plain = (
        attention_mask is None
        and q_length == kv_length
        and isinstance(q_offset, int)
        and q_offset == 0
        and (local_size is None or kv_length <= local_size)
    )
    if plain:
        return None
    return sdpa_mask(
        q_length=q_length,
        kv_length=kv_length,
        attention_mask=attention_mask,
        local_size=local_size,
        q_offset=q_offset,
        **kwargs,
    )


def _register_sdpa() -> None:
    """Make ``autoplan_sdpa`` known to ``transformers`` (idempotent: same name, same functions).

    Process-wide and kept: a model using it looks the name up on every forward. Only
    :func:`build_hf` and :func:`prepare` call it, for a model that uses it.
    """
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(SDPA, _causal_mask)


def _classes(kind: str) -> tuple[type, type[nn.Module]]:
    if kind not in KINDS:
        raise HFConfigError(f"hf = {kind!r} is not a supported model; allowed: {', '.join(KINDS)}")
    lib = _transformers()
    config_name, model_name = KINDS[kind]
    return getattr(lib, config_name), getattr(lib, model_name)


def config_keys(kind: str) -> tuple[str, ...]:
    """The config fields ``kind`` accepts: its config class's fields, their aliases,
    ``attn_implementation``, and for a mixture of experts the capacity form's
    (:data:`autoplan.models.hf_experts.CONFIG_KEYS`)."""
    config_cls, _ = _classes(kind)
    fields = [f.name for f in dataclasses.fields(config_cls) if f.init]
    aliases = list(getattr(config_cls, "attribute_map", {}))
    extra = {"attn_implementation", *(hf_experts.CONFIG_KEYS if kind in MOE_KINDS else ())}
    return tuple(sorted(set(fields) | set(aliases) | extra))


def _attention(kind: str, asked: Any, model_cls: type) -> str:
    default = SDPA if getattr(model_cls, "_supports_sdpa", True) else "eager"
    if asked in (None, "sdpa", SDPA):
        return default
    if asked == "eager":
        return "eager"
    warnings.warn(
        f"autoplan: {kind} attn_implementation={asked!r} cannot be traced on fake CPU tensors; "
        f"planning with {default!r} (transformers' SDPA) instead: same math, same shapes",
        stacklevel=2,  # one location: shown once however often the config is built
    )
    return default


def _experts(kind: str, given: dict[str, Any]) -> dict[str, Any]:
    """The experts implementation and capacity settings of a mixture-of-experts ``kind``,
    taken out of ``given``: always the capacity form, the only one that traces."""
    asked = given.pop("experts_implementation", None)
    if asked not in (None, hf_experts.NAME):
        warnings.warn(
            f"autoplan: {kind} experts_implementation={asked!r} cannot be planned (data-dependent "
            f"shapes, or kernels without sharding rules); planning with {hf_experts.NAME!r}, "
            "the capacity form (autoplan.models.hf_experts)",
            stacklevel=3,
        )
    factor = given.pop("capacity_factor", hf_experts.CAPACITY_FACTOR)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise HFConfigError(
            f"capacity_factor ({factor!r}) must be a positive number for hf: {kind}; "
            f"e.g. {hf_experts.CAPACITY_FACTOR}"
        )
    size = given.pop("group_size", hf_experts.GROUP_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise HFConfigError(
            f"group_size ({size!r}) must be a positive integer for hf: {kind}; "
            f"e.g. {hf_experts.GROUP_SIZE}"
        )
    return {
        "experts_implementation": hf_experts.NAME,
        "capacity_factor": float(factor),
        "group_size": size,
    }


def make_config(kind: str, config: Mapping[str, Any] | None = None) -> Any:
    """The ``transformers`` config object for ``kind``, checked key by key.

    Raises :class:`HFConfigError` naming an unknown key (with the valid ones) or the
    field and rule a value breaks.
    """
    config_cls, model_cls = _classes(kind)
    given = dict(config or {})
    allowed = config_keys(kind)
    for key in given:
        if key not in allowed:
            raise HFConfigError(
                f"unknown {config_cls.__name__} key {key!r} for hf: {kind}; "
                f"allowed: {', '.join(allowed)}"
            )
    attn = _attention(kind, given.pop("attn_implementation", None), model_cls)
    experts = _experts(kind, given) if kind in MOE_KINDS else {}
    defaults: dict[str, Any] = {"use_cache": False} | dict.fromkeys(TOKEN_IDS)
    if kind == "gpt2":
        defaults |= dict.fromkeys(GPT2_DROPOUTS, 0.0)
    from huggingface_hub.errors import StrictDataclassError  # transformers' config checks

    try:
        cfg = config_cls(**(defaults | given | experts), attn_implementation=attn)
    except (StrictDataclassError, TypeError, ValueError) as exc:
        detail = " ".join(str(exc).split())
        raise HFConfigError(f"not a valid {config_cls.__name__} for hf: {kind}: {detail}") from exc
    heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None)
    if kv_heads is not None and (kv_heads < 1 or heads % kv_heads):
        # transformers does not check this; the forward pass would fail in repeat_kv
        raise HFConfigError(
            f"num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads}) "
            f"for hf: {kind}; set num_key_value_heads to a divisor of {heads}"
        )
    return cfg


def build_hf(
    kind: str,
    config: Mapping[str, Any] | None = None,
    *,
    device: str | torch.device = "meta",
    logits_only: bool = True,
) -> nn.Module:
    """``kind``'s causal LM built from ``config``; ``forward(input_ids)`` returns the logits.

    On the meta device by default (no memory); ``device="cpu"`` gives real, randomly
    initialized weights (for checking a plan's execution). ``logits_only=False`` gives
    the Hugging Face class itself: ``forward(input_ids=..., labels=...)`` returns its
    output object, with the loss it computes from ``labels``.

    A model on the ``autoplan_sdpa`` attention (the default) needs that name registered
    with ``transformers`` (``AttentionInterface`` and ``AttentionMaskInterface``, both
    process-wide): this call registers it, and it stays registered so the model keeps
    working after the call. Importing this module registers nothing.
    """
    _, model_cls = _classes(kind)
    cfg = make_config(kind, config)
    if cfg._attn_implementation == SDPA:
        _register_sdpa()
    if kind in MOE_KINDS:
        hf_experts.register()
    if not logits_only:
        return _built(model_cls, model_cls.__name__, cfg, device)

    def forward(self: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        return model_cls.forward(
            self, input_ids=input_ids, use_cache=False, return_dict=True
        ).logits

    logits_cls = type(
        f"{model_cls.__name__}Logits",
        (model_cls,),
        {"forward": forward, "__doc__": f"{model_cls.__name__} whose forward returns logits."},
    )
    return _built(logits_cls, model_cls.__name__, cfg, device)


def _built(cls: type, name: str, cfg: Any, device: str | torch.device) -> nn.Module:
    try:
        with torch.device(device):
            return cls(cfg)
    except ValueError as exc:  # layer checks the config class does not make (GPT-2's heads)
        raise HFConfigError(f"{name} cannot be built from this config: {exc}") from exc


def prepare(model: PreTrainedModel) -> PreTrainedModel:
    """Your own ``transformers`` causal LM, set up to plan and train as ``build_hf``'s are:
    no KV cache (``config.use_cache = False``) and, if it has an SDPA path, the
    ``autoplan_sdpa`` attention (plain causal attention left to SDPA's ``is_causal``,
    which can be sharded by heads), and a mixture of experts' capacity-form experts
    (:mod:`autoplan.models.hf_experts`: a token over an expert's capacity skips it; set
    ``model.config.capacity_factor`` to at least experts / top_k to drop none). Changes
    ``model``'s config in place; returns it.

    Setting the attention registers the name ``autoplan_sdpa`` with ``transformers``
    (process-wide, as :func:`build_hf` does) and leaves it registered: the model looks
    it up on every forward."""
    _transformers()
    model.config.use_cache = False
    if getattr(type(model), "_supports_sdpa", False):
        _register_sdpa()
        model.set_attn_implementation(SDPA)
    if getattr(model.config, "_experts_implementation", None) is not None:
        hf_experts.register()
        model.set_experts_implementation(hf_experts.NAME)
    return model


def position_limit(kind: str, config: Any) -> int | None:
    """The longest sequence a learned position table covers (GPT-2's ``n_positions``);
    ``None`` for rotary models, which compute positions on the fly."""
    return int(config.n_positions) if kind == "gpt2" else None
