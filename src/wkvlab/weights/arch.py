"""Architecture knowledge as data: which op feeds which linears, and how to move a scale across.

AWQ and SmoothQuant divide a linear's input channels by a per-channel factor ``s`` and multiply
the linear's weight columns by ``s``; the division is folded into the op that *produces* that
input (a norm's weight, or the rows of a preceding linear), so the unquantized model computes the
same function. A :class:`Balance` names the producing op, the linears it feeds (regexes relative
to a decoder layer, as llm-compressor's AWQ/SmoothQuant mappings do) and the module whose output
AWQ's search compares. Gemma's RMSNorm multiplies by ``1 + weight`` (HF ``GemmaRMSNorm``,
``Gemma2RMSNorm``, ``Gemma3RMSNorm``), so its fold differs: ``norm_offset`` says which. Gemma 2 and
Gemma 3 share one layer layout (a norm after attention, ``pre_feedforward_layernorm`` before the MLP).

The decoder is the *language model's*: multimodal checkpoints (Gemma 3 4B+, Llama 4, Mistral 3,
Qwen2.5-VL) hold a vision tower with its own ``layers`` list beside it, and their config keeps
the text model's fields in ``text_config``. :func:`text_decoder` asks the model (transformers'
``get_decoder()``) which module that is.

GQA: ``v_proj → o_proj`` can only carry a scale when both have the same width; with grouped
KV heads they do not, and the pair is skipped, as AutoAWQ does (``v_proj.weight.shape ==
o_proj.weight.shape``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from wkvlab.errors import ConfigError
from wkvlab.weights.support import ARCH_MODEL_TYPES


@dataclass(frozen=True)
class Balance:
    prev: str  # regex: the op whose output is the linears' input
    linears: str  # regex: the linears it feeds
    inspect: str  # the module whose output AWQ's scale search compares
    smooth: bool  # SmoothQuant uses it (its reference code smooths the norm → linear pairs only)


@dataclass(frozen=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]
    balances: tuple[Balance, ...]
    norm_offset: float  # RMSNorm output is x̂ · (norm_offset + weight)


_ATTN = Balance(r"input_layernorm", r"self_attn\.[qkv]_proj", "self_attn", True)
_VO = Balance(r"self_attn\.v_proj", r"self_attn\.o_proj", "self_attn.o_proj", False)
_UPDOWN = Balance(r"mlp\.up_proj", r"mlp\.down_proj", "mlp.down_proj", False)
_LLAMA_MLP = Balance(r"post_attention_layernorm", r"mlp\.(gate|up)_proj", "mlp", True)
# Gemma 2 / 3: post_attention_layernorm normalizes the attention *output*; the MLP's input comes
# from pre_feedforward_layernorm (HF Gemma2DecoderLayer / Gemma3DecoderLayer).
_GEMMA_MLP = Balance(r"pre_feedforward_layernorm", r"mlp\.(gate|up)_proj", "mlp", True)
ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", ARCH_MODEL_TYPES["llama"], (_ATTN, _VO, _LLAMA_MLP, _UPDOWN), 0.0),
    Architecture("gemma", ARCH_MODEL_TYPES["gemma"], (_ATTN, _VO, _LLAMA_MLP, _UPDOWN), 1.0),
    Architecture("gemma3", ARCH_MODEL_TYPES["gemma3"], (_ATTN, _VO, _GEMMA_MLP, _UPDOWN), 1.0),
)

LAYER_LIST = re.compile(r"(^|\.)layers$")


def text_config(model: torch.nn.Module):
    """The language model's config (``text_config`` of a multimodal model, else the config itself)."""
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def architecture_of(model: torch.nn.Module) -> Architecture:
    model_type = getattr(text_config(model), "model_type", "")
    for arch in ARCHITECTURES:
        if model_type in arch.model_types:
            return arch
    known = ", ".join(t for a in ARCHITECTURES for t in a.model_types)
    raise ConfigError(f"AWQ and SmoothQuant need an architecture mapping and {model_type!r} has none (known: {known}); use RTN or GPTQ")


def text_decoder(model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    """The language model's decoder (the module holding its ``layers``) and its module name.

    transformers' ``get_decoder()`` names it: ``model`` for a causal LM, ``model.language_model``
    for Gemma3ForConditionalGeneration and the other multimodal models (never the vision tower,
    whose encoder also has ``layers``); Llama 4's ``language_model`` is a causal LM, whose decoder
    is asked in turn. Without ``get_decoder()``, the one ModuleList named ``layers``.
    """
    names = {id(m): n for n, m in model.named_modules()}
    decoder = model
    for _ in range(4):  # Llama 4: get_decoder() is a causal LM whose own decoder holds the layers
        if decoder is not model and isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
            break
        getter = getattr(decoder, "get_decoder", None)
        try:
            inner = getter() if callable(getter) else getattr(decoder, "model", None)
        except (AttributeError, NotImplementedError, TypeError):
            inner = getattr(decoder, "model", None)
        if inner is None or inner is decoder:
            inner = getattr(decoder, "model", None)
        if not isinstance(inner, torch.nn.Module) or inner is decoder:
            break
        decoder = inner
    if id(decoder) in names and isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
        return names[id(decoder)], decoder
    lists = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and LAYER_LIST.search(n)]
    if len(lists) != 1:
        found = f"{len(lists)} ModuleLists named 'layers' ({', '.join(lists)})" if lists else "no ModuleList named 'layers'"
        raise ConfigError(f"cannot tell which decoder layers are the language model's: get_decoder() gives none and there are {found}")
    name = lists[0].rpartition(".")[0]
    return name, model.get_submodule(name) if name else model


def layers_prefix(model: torch.nn.Module) -> str:
    """``model.layers.`` (or ``model.language_model.layers.``): what the names of decoder-layer modules start with."""
    name, _ = text_decoder(model)
    return f"{name}.layers." if name else "layers."


def decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The language model's decoder blocks in order, with their module names (``model.layers.0`` ...)."""
    prefix = layers_prefix(model)
    layers = model.get_submodule(prefix[:-1])
    return [(f"{prefix}{i}", layer) for i, layer in enumerate(layers)]


def resolve(layer: torch.nn.Module, balance: Balance) -> tuple[str, torch.nn.Module, list[tuple[str, torch.nn.Linear]]] | None:
    """The producing op and the linears of ``balance`` inside ``layer``; None when it does not apply."""
    modules = dict(layer.named_modules())
    prev = [(n, m) for n, m in modules.items() if re.fullmatch(balance.prev, n)]
    linears = [(n, m) for n, m in modules.items() if isinstance(m, torch.nn.Linear) and re.fullmatch(balance.linears, n)]
    if len(prev) != 1 or not linears:
        return None
    width = prev[0][1].weight.shape[0]
    if any(m.in_features != width for _, m in linears):
        return None  # GQA v_proj → o_proj: no shared channel axis
    return prev[0][0], prev[0][1], linears


@torch.no_grad()
def fold_scales(prev: torch.nn.Module, linears: list[torch.nn.Linear], scales: torch.Tensor, norm_offset: float) -> None:
    """Divide ``prev``'s output channels by ``scales`` and multiply the linears' columns by them (in place)."""
    s = scales.to(torch.float32)
    if isinstance(prev, torch.nn.Linear):
        prev.weight.data = (prev.weight.data.float() / s[:, None]).to(prev.weight.dtype)
        if prev.bias is not None:
            prev.bias.data = (prev.bias.data.float() / s).to(prev.bias.dtype)
    else:
        w = prev.weight.data.float()
        prev.weight.data = ((norm_offset + w) / s - norm_offset).to(prev.weight.dtype)
        if getattr(prev, "bias", None) is not None:
            prev.bias.data = (prev.bias.data.float() / s).to(prev.bias.dtype)
    for linear in linears:
        linear.weight.data = (linear.weight.data.float() * s[None, :]).to(linear.weight.dtype)
