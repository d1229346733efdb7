"""A KV cache for chunked, teacher-forced evaluation: a window is prefilled chunk by chunk.

Engines prefill long prompts in chunks through their cache, and so does wkvlab: a 32k-token window
on a 262k-vocabulary model would otherwise need its ``[ctx, vocab]`` logits (34 GB in float32) and
its ``[ctx, ctx]`` attention masks at once. Each chunk of queries attends to every earlier token
through this cache, and its logits are reduced to per-token metrics before the next chunk runs.

The numbers must not depend on the chunk size. Every token's K/V is stored exactly as the
teacher-forced hook (:mod:`wkvlab.kv.hook`) stores it for the whole window at once:

* element formats, smoothing, rotation, sinks (first N and detected), pre-RoPE keys and calibrated
  scales act on each token on its own, so a token is stored when its chunk is written;
* per-channel formats quantize closed groups of G tokens; chunks start at multiples of G
  (:func:`check_chunk`), so a group never straddles two chunks;
* residual and sliding windows make the version of a key that a query sees depend on the query:
  those layers keep the full-precision copy too, and the hook picks per (query, key) with the
  chunk's absolute query and key positions (:func:`wkvlab.kv.attention.mixed_attention`).

Sliding-window layers (Gemma 2/3) keep only the keys the window can still reach, as transformers'
own cache does; their absolute key positions are tracked for the selection. What the layer
returns from :meth:`update` is what the model's backend attends to: the stored keys and values.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore
from wkvlab.kv.tokens import token_group_multiple


def check_chunk(chunk: int, specs: list[KVSpec]) -> None:
    """Fail before any work when a per-channel token group would straddle two chunks."""
    if chunk < 1:
        raise ConfigError(f"--chunk {chunk} must be a positive number of tokens")
    for spec in specs:
        multiple = token_group_multiple(spec)
        if chunk % multiple:
            raise ConfigError(f"--chunk {chunk} must be a multiple of {multiple}: {spec.label} quantizes groups of {multiple} tokens per channel")


class _StoredLayer:
    """Bookkeeping shared by the full and the sliding-window layer (a mixin before the transformers class)."""

    def _setup(self, store: LayerStore, layer: int, inputs: dict, keep_raw: bool) -> None:
        self.store, self.layer_index, self.inputs, self.keep_raw = store, layer, inputs, keep_raw
        self.written = 0  # tokens of the window written so far (absolute position of the next one)
        self.query_offset = 0  # absolute position of the first query of the current chunk
        self.key_offset = 0  # absolute position of the first key returned by the last update
        self.raw_keys = self.raw_values = None  # full-precision copies (same tokens as keys/values)
        self.last_raw: tuple[torch.Tensor, torch.Tensor] | None = None
        self.chains = store.flush_chains()  # whole-cache formats: the window's flush chain, kept across chunks

    def _stored_chunk(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """The chunk's keys and values in the stored space: (full precision, as stored)."""
        store = self.store
        seen = self.inputs.get(self.layer_index, {})
        key, value = store.key_value_side(key_states, value_states)
        keep = store.kept_tokens(key.shape[-2], seen.get("residual") if store.sink_peak else None, offset=self.written, device=key.device)
        stored_k = store.store_keys(key, seen.get("position_embeddings"), keep)
        stored_v = store.store_values(value, keep)
        return key, value, stored_k, stored_v

    def _raw_update(self, key: torch.Tensor, value: torch.Tensor, n_cached: int) -> None:
        """Append the full-precision copies, trimmed like the stored ones (``n_cached`` kept before)."""
        if not self.keep_raw:
            return
        if self.raw_keys is None:
            self.raw_keys, self.raw_values = key[..., :0, :], value[..., :0, :]
        full_k = torch.cat([self.raw_keys[..., self.raw_keys.shape[-2] - n_cached :, :], key], dim=-2)
        full_v = torch.cat([self.raw_values[..., self.raw_values.shape[-2] - n_cached :, :], value], dim=-2)
        self.last_raw = (full_k, full_v)
        self.raw_keys, self.raw_values = full_k, full_v


class ChunkedLayer(_StoredLayer, DynamicLayer):
    """A full-attention layer: every token stays."""

    def __init__(self, store: LayerStore, layer: int, inputs: dict, keep_raw: bool) -> None:
        DynamicLayer.__init__(self)
        self._setup(store, layer, inputs, keep_raw)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        key, value, stored_k, stored_v = self._stored_chunk(key_states, value_states)
        n_cached = self.get_seq_length()
        self.query_offset, self.key_offset = self.written, 0
        self._raw_update(key, value, n_cached)
        self.written += key.shape[-2]
        return DynamicLayer.update(self, stored_k, stored_v)


class ChunkedSlidingLayer(_StoredLayer, DynamicSlidingWindowLayer):
    """A sliding-window layer: only the last ``sliding_window - 1`` tokens stay between chunks."""

    def __init__(self, store: LayerStore, layer: int, inputs: dict, keep_raw: bool, sliding_window: int) -> None:
        DynamicSlidingWindowLayer.__init__(self, sliding_window=sliding_window)
        self._setup(store, layer, inputs, keep_raw)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        key, value, stored_k, stored_v = self._stored_chunk(key_states, value_states)
        n_cached = min(self.cumulative_length, self.sliding_window - 1)
        self.query_offset, self.key_offset = self.written, self.written - n_cached
        self._raw_update(key, value, n_cached)
        if self.keep_raw:  # the next chunk needs only what the window can still reach
            self.raw_keys = self.raw_keys[..., -self.sliding_window + 1 :, :]
            self.raw_values = self.raw_values[..., -self.sliding_window + 1 :, :]
        self.written += key.shape[-2]
        return DynamicSlidingWindowLayer.update(self, stored_k, stored_v)


class ChunkedKVCache(Cache):
    """The cache of one window for one KV spec; pass it as ``cache=`` chunk after chunk.

    ``stores``: :func:`wkvlab.kv.hook.layer_stores` of the spec. Use it inside
    ``kv_quantization(model, spec, storage="chunked", stores=stores, cache=this)``, which applies the
    query side and the per-(query, key) selection, and hands the layers what
    :func:`wkvlab.kv.override.attention_inputs` records (rotary angles for pre-RoPE keys, the
    residual stream for detected sinks).
    """

    def __init__(self, model: torch.nn.Module, spec: KVSpec, stores: list[LayerStore]) -> None:
        inputs: dict = {}  # replaced by the recording dict when kv_quantization binds the cache
        template = DynamicCache(config=model.config)  # transformers' own choice of full vs sliding layers
        layers = []
        for index, (kind, store) in enumerate(zip(template.layers, stores)):
            # the full-precision copy is needed only where a query may see a key (or value) unquantized
            keep_raw = store.selection is not None
            if isinstance(kind, DynamicSlidingWindowLayer):
                layers.append(ChunkedSlidingLayer(store, index, inputs, keep_raw, kind.sliding_window))
            else:
                layers.append(ChunkedLayer(store, index, inputs, keep_raw))
        if len(layers) != len(stores):
            raise ConfigError(f"the model has {len(stores)} attention layers but its cache layout has {len(layers)}; this architecture is not supported for chunked evaluation")
        super().__init__(layers=layers)
