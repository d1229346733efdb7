"""Fake-quantize the KV cache inside a transformers model's attention, for teacher-forced passes.

Each attention call goes through :func:`wkvlab.kv.override.attention_override`; per layer, a
:class:`wkvlab.kv.store.LayerStore` turns Q/K/V into what the spec stores and then the model's own
backend (sdpa or eager) runs unchanged. A residual or sliding window, past-only quantization or
per-channel groups of tokens make the key (or value) a query sees depend on the query; such layers
go through :func:`wkvlab.kv.attention.mixed_attention` instead, with one selection per side
(:attr:`wkvlab.kv.store.LayerStore.selection`).

With an identity spec the wrapper only forwards to the backend, so logits are bit-identical to the
untouched model (tested: this is the proof that the hook itself adds no error).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from wkvlab.formats.hadamard import rotate
from wkvlab.kv.attention import mixed_attention
from wkvlab.errors import ConfigError
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.requant import flush_attention
from wkvlab.kv.override import attention_devices, attention_inputs, attention_override, model_head_dim, model_kv_heads, sliding_layers
from wkvlab.kv.readprec import mask_to
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore


def layer_stores(model: torch.nn.Module, spec: KVSpec, stats: KVStats | None = None) -> list[LayerStore]:
    head_dim, kv_heads = model_head_dim(model), model_kv_heads(model)
    spec.check_model(head_dim, model.config.get_text_config().num_hidden_layers)
    sliding = sliding_layers(model)
    devices = attention_devices(model) if stats is not None else {}
    for i in range(model.config.get_text_config().num_hidden_layers):
        if i < len(sliding) and sliding[i] and any(f.requantizes for f in spec.formats_for(i, True)):
            raise ConfigError(f"{spec.label}: transformers' QuantizedCache supports only full-attention models and layer {i} "
                              "has a sliding window; add +skip=sliding_window to keep those layers at model precision")
    return [
        LayerStore(spec, i, *spec.formats_for(i, sliding[i] if i < len(sliding) else False), head_dim, stats, devices.get(i), kv_heads)
        for i in range(model.config.get_text_config().num_hidden_layers)
    ]


@contextmanager
def kv_quantization(
    model: torch.nn.Module,
    spec: KVSpec,
    storage: str = "simulate",
    stats: KVStats | None = None,
    stores: list[LayerStore] | None = None,
    cache=None,
) -> Iterator[None]:
    """Within the block, every attention layer of ``model`` sees K and V as ``spec`` stores them.

    ``storage="simulate"``: teacher-forced, the hook quantizes K/V itself (no cache object).
    ``storage="cache"``: a :class:`wkvlab.kv.cache.QuantizeOnWriteCache` already stored K/V (in the
    smoothed/rotated space); the hook only handles the query side and un-rotates V's output.
    ``stats``: calibration statistics, required by specs with ``smooth`` or calibrated ``scales``.
    ``storage="chunked"``: ``cache`` is a :class:`wkvlab.kv.chunked.ChunkedKVCache` fed one chunk
    of the window at a time; it stores K/V exactly as ``simulate`` does for the whole window, and
    layers whose view depends on the query get their full-precision copies from it.
    ``stores``: :func:`layer_stores` built once and reused across windows (fitting KVQuant
    codebooks per window would repeat the same work on every pass).
    """
    if storage not in ("simulate", "cache", "chunked"):
        raise ValueError(f"storage must be 'simulate', 'cache' or 'chunked', got {storage!r}")
    if (storage == "chunked") != (cache is not None):
        raise ValueError("storage='chunked' needs the ChunkedKVCache (cache=), and only it takes one")
    stores = stores if stores is not None else layer_stores(model, spec, stats)
    with attention_inputs(model) as inputs:
        for layer in cache.layers if cache is not None else ():
            layer.inputs = inputs

        def attention(backend, module, query, key, value, attention_mask, **kwargs):
            store = stores[module.layer_idx]
            # a 16-bit run of an engine that reads K/V wider holds this layer in that precision
            # (kv/readprec.py); the output goes back to the model's dtype
            run_dtype = query.dtype
            attention_mask = mask_to(attention_mask, store.work_dtype(run_dtype))
            if storage == "cache":
                out, weights = backend(module, store.query_side(query), key, value, attention_mask, **kwargs)
            elif storage == "chunked":
                layer = cache.layers[module.layer_idx]
                query = store.query_side(query)
                if layer.last_raw is None:  # every key is seen as stored: the model's own backend
                    out, weights = backend(module, query, key, value, attention_mask, **kwargs)
                elif layer.chains is not None:  # a whole-cache format: each query sees its flush's version
                    raw_k, raw_v = layer.last_raw
                    out = flush_attention(
                        query, raw_k, raw_v, key, value, layer.chains, attention_mask, scaling=kwargs.get("scaling") or module.scaling,
                        selection=store.selection, query_offset=layer.query_offset, softcap=kwargs.get("softcap"),
                    )
                    weights = None
                else:
                    raw_k, raw_v = layer.last_raw
                    out = mixed_attention(
                        query, raw_k, key, raw_v, value, attention_mask,
                        scaling=kwargs.get("scaling") or module.scaling, selection=store.selection, softcap=kwargs.get("softcap"),
                        query_offset=layer.query_offset, key_offset=layer.key_offset,
                    )
                    weights = None
            else:
                seen = inputs.get(module.layer_idx, {})
                query, key, key_q, value, value_q = store.apply(query, key, value, seen.get("position_embeddings"), seen.get("residual"))
                selection = store.selection
                chains = store.flush_chains()
                if chains is not None:
                    out = flush_attention(
                        query, key, value, key_q, value_q, chains, attention_mask, scaling=kwargs.get("scaling") or module.scaling,
                        selection=selection, softcap=kwargs.get("softcap"),
                    )
                    weights = None
                elif selection is None:
                    out, weights = backend(module, query, key_q, value_q, attention_mask, **kwargs)
                else:
                    out = mixed_attention(
                        query, key, key_q, value, value_q, attention_mask,
                        scaling=kwargs.get("scaling") or module.scaling, selection=selection, softcap=kwargs.get("softcap"),
                    )
                    weights = None
            if store.rot_v:
                out = rotate(out, store.rot_v, inverse=True)
            inputs.pop(module.layer_idx, None)  # this layer's hidden states are used: not kept until the next chunk
            return out.to(run_dtype), weights

        try:
            with attention_override(model, attention):
                yield
        finally:
            inputs.clear()  # a cache outliving the block holds this dict: no hidden states in it
