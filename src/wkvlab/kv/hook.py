"""Fake-quantize the KV cache inside a transformers model's attention, for teacher-forced passes.

transformers 5.x routes every attention layer through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
with the post-RoPE key/value states of shape ``[batch, kv_heads, tokens, head_dim]`` (before GQA
expansion). We register a uniquely named wrapper that quantizes K and V and then calls the model's
own backend (sdpa or eager) unchanged, point the model's config at it, and undo both on exit.
The mask registry gets the same name pointing at the original mask builder, otherwise transformers
would build no mask and sliding-window layers (Gemma 3) would silently attend to everything.

No module-level state: each ``kv_quantization`` context owns its registry entries and removes them.
With an identity spec the wrapper only forwards to the backend, so logits are bit-identical to the
untouched model (tested: this is the proof that the hook itself adds no error).
"""
from __future__ import annotations

import sys
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from wkvlab.errors import ModelError
from wkvlab.kv.spec import KVSpec


def _eager_for(module: torch.nn.Module) -> Callable:
    """The eager attention of the module's own modeling file (Gemma's adds softcapping, etc.)."""
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward")


def model_head_dim(model: torch.nn.Module) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim) if head_dim else cfg.hidden_size // cfg.num_attention_heads


@contextmanager
def kv_quantization(model: torch.nn.Module, spec: KVSpec) -> Iterator[None]:
    """Within the block, every attention layer of ``model`` sees K and V as ``spec`` stores them."""
    head_dim = model_head_dim(model)
    spec.k_format.check_head_dim(head_dim)
    spec.v_format.check_head_dim(head_dim)
    quant_k, quant_v = spec.k_format.quantize, spec.v_format.quantize
    original = model.config._attn_implementation or "eager"
    name = f"wkvlab_kv_{uuid.uuid4().hex[:12]}"

    def attention(module, query, key, value, attention_mask, **kwargs):
        backend = ALL_ATTENTION_FUNCTIONS.get_interface(original, _eager_for(module))
        if quant_k is not None:
            key = quant_k(key).to(key.dtype)
        if quant_v is not None:
            value = quant_v(value).to(value.dtype)
        return backend(module, query, key, value, attention_mask, **kwargs)

    mask_builder = AttentionMaskInterface._global_mapping.get(original)
    if mask_builder is None:
        raise ModelError(f"attention implementation {original!r} is not supported for KV simulation; load the model with 'sdpa' or 'eager'")
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask_builder)
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = original
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)
