"""A quantize-on-write KV cache for ``model.generate`` and step-by-step streaming.

The teacher-forced hook (:mod:`wkvlab.kv.hook`) decides, for every (query, key) pair, which
version of the key the query sees. This cache reaches the same state the way an engine does: each
layer keeps its tokens, and quantizes a token once the spec's rule says it is stored quantized —

* plain formats: on write, the new token included (llama.cpp, vLLM);
* ``residual=R`` (KIVI keys, HF QuantizedCache): when R full-precision tokens have piled up they
  are quantized together (per-channel formats quantize whole groups of tokens);
* ``window=W`` (SKVQ, KIVI values): a token is quantized when it is W tokens old;
* ``pastonly`` (WKVQuant): a token is quantized once the step that wrote it is over;
* sinks (the first N, or tokens detected by their activation peak) are never quantized.

Keys and values follow their own rule (:mod:`wkvlab.kv.tokens`), so each side keeps its own
quantized prefix.

Storage holds dequantized values in the rotated space (when the spec rotates), which is what the
attention reads; the query side (rotation, query quantization, un-rotating V's output) stays in
the hook, used with ``storage="cache"``. Streaming one token at a time reproduces the teacher-forced
logits on every causal format (tested). A multi-token update on a spec whose view depends on the
query (residual, window, per-channel groups) follows the engines' prefill: the chunk attends to
itself at full precision, and the state after it is what streaming would have reached.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.override import attention_inputs
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore


class QuantizeOnWriteLayer(DynamicLayer):
    """One layer's cache: full-precision copies plus the quantized prefix the rule allows."""

    def __init__(self, spec: KVSpec, store: LayerStore, layer: int, inputs: dict | None) -> None:
        super().__init__()
        self.spec, self.store, self.layer, self.inputs = spec, store, layer, inputs
        self.cos = self.sin = None  # rotary angles of every token so far, for pre-RoPE storage
        self.keep = None  # [batch, tokens] kept at model precision (first N, detected sinks)
        self.raw_keys = self.raw_values = None
        self.n_quantized = {"k": 0, "v": 0}
        self.quant_keys = self.quant_values = None

    @staticmethod
    def _quantize(x: torch.Tensor, quantize) -> torch.Tensor:
        return x if quantize is None else quantize(x).to(x.dtype)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        store = self.store
        # into the stored space first: every copy is then held in the layer's work dtype (kv/readprec.py)
        key_states, value_states = store.key_value_side(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.raw_keys, self.raw_values = key_states[..., :0, :], value_states[..., :0, :]
            self.quant_keys, self.quant_values = self.raw_keys, self.raw_values
        position = self.raw_keys.shape[-2]
        if store.prerope:
            cos, sin = self.inputs[self.layer]["position_embeddings"]
            self.cos = cos if self.cos is None else torch.cat([self.cos, cos], dim=-2)
            self.sin = sin if self.sin is None else torch.cat([self.sin, sin], dim=-2)
        residual = (self.inputs or {}).get(self.layer, {}).get("residual") if store.sink_peak else None
        keep = store.kept_tokens(key_states.shape[-2], residual, offset=position, device=key_states.device)
        if keep is not None:
            keep = keep.expand(key_states.shape[0], -1)
            self.keep = keep if self.keep is None else torch.cat([self.keep, keep], dim=-1)
        self.raw_keys = torch.cat([self.raw_keys, key_states], dim=-2)
        self.raw_values = torch.cat([self.raw_values, value_states], dim=-2)
        n_new = key_states.shape[-2]
        # Newly quantized tokens start where the previous flush ended, so per-channel groups stay aligned.
        k_target, v_target = store.k_policy.quantized_prefix(position, n_new), store.v_policy.quantized_prefix(position, n_new)
        if k_target > self.n_quantized["k"]:
            lo = self.n_quantized["k"]
            if store.k_whole:  # the whole cache re-quantized: what was stored (dequantized) and the flushed tokens
                self.quant_keys = self._quantize(torch.cat([self.quant_keys, self.raw_keys[..., lo:k_target, :]], dim=-2), store.k_quant)
            elif store.prerope:  # sinks are restored below, for the whole sequence at once
                new_k = store.quantize_prerope(self.raw_keys[..., lo:k_target, :], (self.cos[:, lo:k_target], self.sin[:, lo:k_target]))
            else:
                new_k = self._quantize(self.raw_keys[..., lo:k_target, :], store.k_quant)
            if not store.k_whole:
                self.quant_keys = torch.cat([self.quant_keys, new_k], dim=-2)
            self.n_quantized["k"] = k_target
        if v_target > self.n_quantized["v"]:
            new_v = self.raw_values[..., self.n_quantized["v"] : v_target, :]
            if store.v_whole:
                self.quant_values = self._quantize(torch.cat([self.quant_values, new_v], dim=-2), store.v_quant)
            else:
                self.quant_values = torch.cat([self.quant_values, self._quantize(new_v, store.v_quant)], dim=-2)
            self.n_quantized["v"] = v_target
        keys = torch.cat([self.quant_keys, self.raw_keys[..., self.n_quantized["k"] :, :]], dim=-2)
        values = torch.cat([self.quant_values, self.raw_values[..., self.n_quantized["v"] :, :]], dim=-2)
        keys, values = store.restore(self.raw_keys, keys, self.keep), store.restore(self.raw_values, values, self.keep)
        self.keys, self.values = keys, values
        return keys, values


class QuantizeOnWriteCache(Cache):
    """The ``cache`` (formerly ``past_key_values``) for a model running under ``kv_quantization(model, spec, storage="cache")``."""

    def __init__(self, model: torch.nn.Module, spec: KVSpec, stats: KVStats | None = None, inputs: dict | None = None) -> None:
        """``inputs``: the dict of :func:`wkvlab.kv.override.attention_inputs`, needed with ``prerope``."""
        if (spec.prerope or spec.sink_ratio) and inputs is None:
            raise ValueError("a prerope spec needs the attention inputs (rotary angles); use quantized_generate or stream_logits")
        stores = layer_stores(model, spec, stats)
        super().__init__(layers=[QuantizeOnWriteLayer(spec, store, i, inputs) for i, store in enumerate(stores)])


@torch.no_grad()
def stream_logits(model: torch.nn.Module, spec: KVSpec, tokens: torch.Tensor, stats: KVStats | None = None) -> torch.Tensor:
    """Logits ``[T, vocab]`` of ``tokens`` fed one at a time through the quantize-on-write cache."""
    from wkvlab.kv.hook import kv_quantization

    rows = []
    with attention_inputs(model) as inputs, kv_quantization(model, spec, storage="cache", stats=stats):
        cache = QuantizeOnWriteCache(model, spec, stats, inputs)
        for position in range(tokens.shape[0]):
            out = model(input_ids=tokens[None, position : position + 1], cache=cache, use_cache=True)
            rows.append(out.logits[0, -1])
    return torch.stack(rows)


@torch.no_grad()
def quantized_generate(model: torch.nn.Module, spec: KVSpec, input_ids: torch.Tensor, stats: KVStats | None = None, **generate_kwargs):
    """``model.generate`` with the KV cache stored as ``spec`` says (greedy unless told otherwise)."""
    from wkvlab.kv.hook import kv_quantization

    generate_kwargs.setdefault("do_sample", False)
    with attention_inputs(model) as inputs, kv_quantization(model, spec, storage="cache", stats=stats):
        return model.generate(input_ids, cache=QuantizeOnWriteCache(model, spec, stats, inputs), **generate_kwargs)
