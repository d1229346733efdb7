"""The one place wkvlab reaches into transformers' attention dispatch.

transformers 5.x routes every attention layer through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
with the post-RoPE key/value states of shape ``[batch, kv_heads, tokens, head_dim]`` (before GQA
expansion). :func:`attention_override` registers a uniquely named wrapper around the model's own
backend (sdpa, or the modeling file's eager function), points the config at it, and undoes both on
exit — also on error. The mask registry gets the same name pointing at the original mask builder;
without it transformers would build no mask and sliding-window layers (Gemma 3) would silently
attend to everything. No module-level state: each context owns its registry entries.
"""
from __future__ import annotations

import re
import sys
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from wkvlab.errors import ModelError

# wrapper(backend, module, query, key, value, attention_mask, **kwargs) -> (output, weights)
AttentionWrapper = Callable[..., tuple]


def _eager_for(module: torch.nn.Module) -> Callable:
    """The eager attention of the module's own modeling file (Gemma's adds softcapping, etc.)."""
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward")


def model_head_dim(model: torch.nn.Module) -> int:
    cfg = model.config.get_text_config()  # a multimodal model's language part
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim) if head_dim else cfg.hidden_size // cfg.num_attention_heads


def model_kv_heads(model: torch.nn.Module) -> int:
    """K/V heads per layer as the model's attention builds them. Falcon's original decoder with
    ``multi_query`` has one, whatever ``num_kv_heads`` says (transformers 5.24 modeling_falcon.py
    ``FalconAttention``: ``config.num_kv_heads if (new_decoder_architecture or not multi_query) else 1``)."""
    cfg = model.config.get_text_config()
    if getattr(cfg, "multi_query", False) and not getattr(cfg, "new_decoder_architecture", False):
        return 1
    return int(getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None) or cfg.num_attention_heads)


def sliding_layers(model: torch.nn.Module) -> tuple[bool, ...]:
    """Which decoder layers use sliding-window attention (Gemma 2/3, Mistral with a window)."""
    cfg = model.config.get_text_config()
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(t == "sliding_attention" for t in types)
    window = getattr(cfg, "sliding_window", None)
    return tuple(bool(window) for _ in range(cfg.num_hidden_layers))


def attention_devices(model: torch.nn.Module) -> dict[int, torch.device]:
    """Where each attention layer computes (by ``layer_idx``): accelerate's execution device for a
    dispatched or offloaded layer, else the device of its weights."""
    devices = {}
    for name, module in model.named_modules():
        if name.endswith("self_attn") and hasattr(module, "layer_idx"):
            device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
            if device is None:
                device = next(module.parameters()).device
            devices[module.layer_idx] = torch.device(device)
    return devices


@contextmanager
def attention_override(model: torch.nn.Module, wrapper: AttentionWrapper) -> Iterator[None]:
    """Within the block every attention call of ``model`` goes through ``wrapper``."""
    original = model.config._attn_implementation or "eager"
    mask_builder = AttentionMaskInterface._global_mapping.get(original)
    if mask_builder is None:
        raise ModelError(f"attention implementation {original!r} is not supported for KV simulation; load the model with 'sdpa' or 'eager'")
    name = f"wkvlab_kv_{uuid.uuid4().hex[:12]}"

    def attention(module, query, key, value, attention_mask, **kwargs):
        backend = ALL_ATTENTION_FUNCTIONS.get_interface(original, _eager_for(module))
        return wrapper(backend, module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask_builder)
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = original
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)


@contextmanager
def attention_inputs(model: torch.nn.Module) -> Iterator[dict[int, dict]]:
    """Within the block, ``seen[layer]`` holds the latest inputs of each layer's attention:
    ``hidden_states`` (normalized, as attention gets them), ``position_embeddings`` (cos, sin) and
    ``residual`` (the decoder layer's input, i.e. the residual stream before its norm).

    Pre-RoPE quantization (KVQuant) needs the rotary angles to undo RoPE on the keys it receives;
    sink detection (KVSink) needs the token's own residual-stream activations, where attention sinks
    carry their massive outliers (the norm in front of attention hides them). Forward pre-hooks,
    removed on exit.
    """
    seen: dict[int, dict] = {}

    def record_attention(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        entry = seen.setdefault(module.layer_idx, {})
        entry.update(hidden_states=hidden, position_embeddings=kwargs.get("position_embeddings"))

    def record_layer(index):
        def hook(module, args, kwargs):
            seen.setdefault(index, {})["residual"] = kwargs.get("hidden_states", args[0] if args else None)

        return hook

    handles = [
        module.register_forward_pre_hook(record_attention, with_kwargs=True)
        for name, module in model.named_modules()
        if name.endswith("self_attn") and hasattr(module, "layer_idx")
    ]
    for name, module in model.named_modules():
        match = re.search(r"(?:^|\.)layers\.(\d+)$", name)
        if match:
            handles.append(module.register_forward_pre_hook(record_layer(int(match.group(1))), with_kwargs=True))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def undo_rope(key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pre-RoPE keys from post-RoPE ones (``k·cos + rotate_half(k)·sin`` rotated back by −θ)."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, tokens, head_dim] against [batch, heads, tokens, head_dim]
    return key * cos - rotate_half(key) * sin


def apply_rope(key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos[:, None], sin[:, None]
    return key * cos + rotate_half(key) * sin
