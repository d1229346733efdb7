"""Fake-quantize the KV cache inside a transformers model's attention, for teacher-forced passes.

transformers 5.x routes every attention layer through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
with the post-RoPE key/value states of shape ``[batch, kv_heads, tokens, head_dim]`` (before GQA
expansion). We register a uniquely named wrapper that stores K and V the way the spec says and then
calls the model's own backend (sdpa or eager) unchanged, point the model's config at it, and undo
both on exit. The mask registry gets the same name pointing at the original mask builder,
otherwise transformers would build no mask and sliding-window layers (Gemma 3) would silently
attend to everything.

Per layer, in order: the layer's formats (skipped layers and per-layer overrides), the Hadamard
rotation of Q/K (and V, un-rotated on the output), quantization, sink tokens restored to full
precision, queries quantized where the spec says. A residual or sliding window, or per-channel
groups of tokens, make the key a query sees depend on the query; such layers go through
:func:`wkvlab.kv.attention.mixed_attention`.

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
from wkvlab.formats import fake_quant_fp8, fake_quant_ggml
from wkvlab.formats.hadamard import rotate
from wkvlab.kv.attention import mixed_attention
from wkvlab.kv.formats import KVFormat
from wkvlab.kv.spec import KVSpec


def _eager_for(module: torch.nn.Module) -> Callable:
    """The eager attention of the module's own modeling file (Gemma's adds softcapping, etc.)."""
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward")


def model_head_dim(model: torch.nn.Module) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim) if head_dim else cfg.hidden_size // cfg.num_attention_heads


def sliding_layers(model: torch.nn.Module) -> tuple[bool, ...]:
    """Which decoder layers use sliding-window attention (Gemma 2/3, Mistral with a window)."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(t == "sliding_attention" for t in types)
    window = getattr(cfg, "sliding_window", None)
    return tuple(bool(window) for _ in range(cfg.num_hidden_layers))


def _quantize_query(query: torch.Tensor, q_format: str) -> torch.Tensor:
    if q_format == "q8_0":
        return fake_quant_ggml(query, "q8_0").to(query.dtype)
    return fake_quant_fp8(query, "e4m3", 1.0).to(query.dtype)


class _LayerStore:
    """What one spec does to one layer's Q, K and V (built once per layer and reused)."""

    def __init__(self, spec: KVSpec, k_fmt: KVFormat, v_fmt: KVFormat, head_dim: int) -> None:
        self.k_fmt, self.v_fmt = k_fmt, v_fmt
        block = spec.rotation_block(head_dim)
        self.rot_k = block if (block and not k_fmt.is_identity) else 0
        self.rot_v = block if (block and not v_fmt.is_identity) else 0
        self.sinks = spec.sinks
        self.q_format = spec.q if not k_fmt.is_identity else "none"

    def _store(self, x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
        if fmt.is_identity:
            return x
        stored = fmt.quantize(x).to(x.dtype)
        if self.sinks:
            n = min(self.sinks, x.shape[-2])
            stored = torch.cat([x[..., :n, :], stored[..., n:, :]], dim=-2)
        return stored

    def apply(self, query, key, value):
        """Rotated-space Q, K, V, their stored versions, and whether V's output needs un-rotating."""
        if self.rot_k:
            query, key = rotate(query, self.rot_k), rotate(key, self.rot_k)
        if self.rot_v:
            value = rotate(value, self.rot_v)
        key_q, value_q = self._store(key, self.k_fmt), self._store(value, self.v_fmt)
        if self.q_format != "none":
            query = _quantize_query(query, self.q_format)
        return query, key, key_q, value, value_q

    def query_side(self, query):
        """The query as the attention sees it when K/V come from a quantize-on-write cache."""
        if self.rot_k:
            query = rotate(query, self.rot_k)
        return _quantize_query(query, self.q_format) if self.q_format != "none" else query


@contextmanager
def kv_quantization(model: torch.nn.Module, spec: KVSpec, storage: str = "simulate") -> Iterator[None]:
    """Within the block, every attention layer of ``model`` sees K and V as ``spec`` stores them.

    ``storage="simulate"``: teacher-forced, the hook quantizes K/V itself (no cache object).
    ``storage="cache"``: a :class:`wkvlab.kv.cache.QuantizeOnWriteCache` already stored K/V (in the
    rotated space); the hook only handles the query side and un-rotates V's output.
    """
    if storage not in ("simulate", "cache"):
        raise ValueError(f"storage must be 'simulate' or 'cache', got {storage!r}")
    head_dim = model_head_dim(model)
    spec.check_model(head_dim, model.config.num_hidden_layers)
    sliding = sliding_layers(model)
    stores = {
        layer: _LayerStore(spec, *spec.formats_for(layer, sliding[layer] if layer < len(sliding) else False), head_dim)
        for layer in range(model.config.num_hidden_layers)
    }
    selection = spec.selection()
    original = model.config._attn_implementation or "eager"
    name = f"wkvlab_kv_{uuid.uuid4().hex[:12]}"

    def attention(module, query, key, value, attention_mask, **kwargs):
        backend = ALL_ATTENTION_FUNCTIONS.get_interface(original, _eager_for(module))
        store = stores[module.layer_idx]
        if storage == "cache":
            out, weights = backend(module, store.query_side(query), key, value, attention_mask, **kwargs)
            return (rotate(out, store.rot_v, inverse=True) if store.rot_v else out), weights
        query, key, key_q, value, value_q = store.apply(query, key, value)
        if selection is None or (store.k_fmt.is_identity and store.v_fmt.is_identity):
            out, weights = backend(module, query, key_q, value_q, attention_mask, **kwargs)
        else:
            out = mixed_attention(
                query, key, key_q, value, value_q, attention_mask,
                scaling=kwargs.get("scaling") or module.scaling, selection=selection, softcap=kwargs.get("softcap"),
            )
            weights = None
        if store.rot_v:
            out = rotate(out, store.rot_v, inverse=True)
        return out, weights

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
