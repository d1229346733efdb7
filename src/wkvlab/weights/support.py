"""Which weight configs a model's architecture takes, decided from its config (no torch).

Every refusal here is worded once and used twice: before loading, from ``config.json``
(:func:`check_config`, called by the CLI's preflight), and after loading, from the modules
themselves (:mod:`wkvlab.weights.apply`), so a model whose config did not tell is still refused
before any work — never quantized partly under a full label.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from wkvlab.errors import ConfigError
from wkvlab.weights.spec import WeightSpec

# Model types whose decoder layer AWQ and SmoothQuant know how to fold scales into
# (wkvlab.weights.arch.ARCHITECTURES, keyed by architecture name). Multimodal models are looked up
# by their text config's model_type (Mistral 3 → mistral, Qwen2.5-VL → qwen2_5_vl_text).
ARCH_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "llama": ("llama", "mistral", "qwen2", "qwen3", "qwen2_5_vl_text", "qwen2_vl_text"),
    "gemma": ("gemma",),
    "gemma3": ("gemma3_text", "gemma3", "gemma2"),
}
BALANCED_METHODS = ("awq", "smoothquant")
# activation scales from each token alone, the same whichever expert reads it (wkvlab.weights.experts)
DYNAMIC_ACTIVATIONS = ("int8-token", "fp8-token", "mxfp4")
# config.json keys that declare routed experts (Mixtral / Llama 4, Qwen-MoE, DeepSeek)
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


# Text model types whose experts are fused tensors transformers does not declare (no
# use_experts_implementation, so no layout flags): wkvlab.weights.experts cannot read them.
UNDECLARED_EXPERTS = {"llama4_text": "Llama4TextExperts"}


def unknown_experts_refusal(where: str, what: str) -> str:
    """The one wording for fused expert tensors of an unknown layout (before and after loading)."""
    return (f"{where}: {what}, a layout wkvlab does not know; quantizing the rest would label a partly quantized model "
            "as a whole, so this model takes only --kv configs")


def text_section(config: Mapping) -> Mapping:
    """The language model's part of a config.json (``text_config`` of a multimodal model)."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def declares_experts(config: Mapping) -> bool:
    text = text_section(config)
    return any(isinstance(text.get(k), int) and text[k] > 1 for k in _EXPERT_KEYS)


def mapping_refusal(spec: WeightSpec, model_type: str) -> str | None:
    """Why AWQ / SmoothQuant cannot run on ``model_type`` (None: mapped, or the spec uses neither)."""
    methods = {s.method for s in _subs(spec)} & set(BALANCED_METHODS)
    if not methods or any(model_type in types for types in ARCH_MODEL_TYPES.values()):
        return None
    known = ", ".join(t for types in ARCH_MODEL_TYPES.values() for t in types)
    return (f"{spec.label}: AWQ and SmoothQuant need an architecture mapping and {model_type!r} has none "
            f"(known: {known}); use RTN or GPTQ")


def expert_refusal(spec: WeightSpec, where: str) -> str | None:
    """Why ``spec`` (the spec a fused-experts matrix gets) cannot quantize MoE experts; None when it can.

    Round-to-nearest in every format and GPTQ quantize each expert's matrix as its own linear,
    with dynamic per-token activations or none (:mod:`wkvlab.weights.experts`); the rest would
    need what wkvlab does not implement.
    """
    if spec.method in BALANCED_METHODS:
        return (f"{spec.label}: {spec.method} on the fused MoE experts of {where} is not implemented (one scale per input channel "
                f"shared by every expert, searched on the whole MoE block); use gptq-int4-g128 or int4-g128 on MoE models")
    if spec.method == "llm-int8" or spec.activations not in ("none", *DYNAMIC_ACTIVATIONS):
        return (f"{spec.label}: {spec.activations if spec.method != 'llm-int8' else 'LLM.int8()'} activations inside the fused MoE "
                f"experts of {where} are not implemented (a static or outlier-dependent scale per expert input); use dynamic "
                f"per-token activations (fp8, int8;a=int8, mxfp4) or a weight-only config (int4-g128, gptq-int4-g128, fp8-wo, nvfp4-wo)")
    return None


def _subs(spec: WeightSpec) -> list[WeightSpec]:
    return [spec] + [spec.override_spec(text) for _, text in spec.overrides]


# What the experts of a layer are called in transformers' MoE models (Mixtral, Qwen-MoE, DeepSeek):
# the names overrides and skips see, checked before loading as they will be after.
_EXPERT_NAMES = ("model.layers.{i}.mlp.experts.gate_up_proj.0", "model.layers.{i}.mlp.experts.down_proj.0")


def check_config(specs: Iterable[WeightSpec], config: Mapping, source: str) -> None:
    """Refuse, in one line and before loading, a weight config the model's config.json already rules out."""
    text = text_section(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    layers = int(text.get("num_hidden_layers") or 1)
    moe = declares_experts(config)
    undeclared = UNDECLARED_EXPERTS.get(model_type) if moe else None
    for spec in specs:
        if spec.is_identity or spec.is_checkpoint:
            continue
        if undeclared:
            raise ConfigError(f"{spec.label}: " + unknown_experts_refusal(f"{source} ({model_type})", f"fused experts in {undeclared}"))
        reason = None
        if moe:  # the experts' own refusal first: it says what to use instead
            subs = {spec.for_linear(n.format(i=i), i, layers) for i in range(layers) for n in _EXPERT_NAMES} - {None}
            reason = next((r for r in (expert_refusal(s, f"{source} ({model_type})") for s in subs) if r), None)
        reason = reason or mapping_refusal(spec, model_type)
        if reason:
            raise ConfigError(reason)
