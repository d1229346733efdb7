"""Interventions on the (W, C) run: remove the cross term's cache part, keep the sinks at 16 bits.

The decomposition (:mod:`wkvlab.explain.attention`) says how large ε_q·ε_k,cᵀ is inside
attention; whether it is what makes the *output* compound is a causal question, answered here by
changing the run and measuring the output again on the same tokens:

* **The cross term removed.** The weight-quantized model runs with the quantized cache, but at
  every layer its attention scores are

      S′ = Q·K_storedᵀ·s − ε_q·ε_k,cᵀ·s,   ε_q = Q − Q_R,   ε_k,c = K_stored − K_W

  with Q_R the reference pass's query and K_W the (W, fp16) pass's key at that layer (both
  recorded beforehand, :mod:`wkvlab.explain.cells`; Q and K_stored the intervened run's own, so
  the change propagates). Everything else — the values the cache stores, the softmax, the mask,
  softcapping, the rest of the network — is the run's own. With the output KLD of the four cells
  the interaction is I = KLD(W+C) − KLD(W) − KLD(C) (KLD(R) = 0); with the term removed it is
  I′ = KLD(W+C)′ − KLD(W) − KLD(C), and I − I′ = KLD(W+C) − KLD(W+C)′ is the part of the output
  interaction the term carries.
* **Sinks at 16 bits.** The same (W, C) run with the first :data:`SINK_TOKENS` tokens kept at 16
  bits in the cache (the spec's ``+sinks=N``, what KVQuant, StreamingLLM and SKVQ do), paired
  against the plain (W, C) run: how much of the cache's cost under these weights sits on the sinks,
  measured by changing it rather than read off an RMS.

Every effect gets its paired interval over windows and its verdict from the one rule
(:mod:`wkvlab.explain.crossterm`).

Pure tensor functions first (:func:`cross_cache_term`, :func:`intervened_scores`,
:func:`scores_attention`); the hook (:func:`intervened_logits`) only gathers their inputs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from wkvlab.explain.attention import SINK_TOKENS, allowed_pairs, to_store_space
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore
from wkvlab.explain.crossterm import ATTENTION_CELLS

Observer = Callable[[int, torch.Tensor, torch.Tensor], None]  # (layer, scores before, term removed), [heads, q, k]


def cross_cache_term(query: torch.Tensor, query_ref: torch.Tensor, key: torch.Tensor, key_w: torch.Tensor,
                     scaling: float) -> torch.Tensor:
    """ε_q·ε_k,cᵀ·s = (Q − Q_R)(K − K_W)ᵀ·s, ``[..., queries, keys]`` from ``[..., tokens, head_dim]`` (same heads)."""
    return ((query - query_ref) @ (key - key_w).transpose(-1, -2)) * scaling


def intervened_scores(query: torch.Tensor, query_ref: torch.Tensor, key: torch.Tensor, key_w: torch.Tensor,
                      scaling: float) -> torch.Tensor:
    """The scores with the cross term's cache part removed: Q·Kᵀ·s − ε_q·ε_k,cᵀ·s."""
    return (query @ key.transpose(-1, -2)) * scaling - cross_cache_term(query, query_ref, key, key_w, scaling)


def scores_attention(scores: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, softcap: float | None = None,
                     value_full: torch.Tensor | None = None, use_stored_value: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output ``[..., queries, head_dim]`` from given ``scores`` ``[..., queries, keys]``: softcap, the
    allowed pairs, softmax, the values (per pair the stored or the full-precision value where
    ``use_stored_value`` says, residual specs)."""
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    if use_stored_value is None or value_full is None:
        return probs @ value
    return torch.where(use_stored_value, probs, 0.0) @ value + torch.where(use_stored_value, 0.0, probs) @ value_full


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1)


@torch.no_grad()
def intervened_logits(model: torch.nn.Module, kv: KVSpec, ids: torch.Tensor, stores: list[LayerStore], reference, weights_only,
                      *, observe: Observer | None = None) -> torch.Tensor:
    """Float32 logits of ``model`` (the weight-quantized one) under ``kv`` on one window ``ids`` ``[1, tokens]``,
    with ε_q·ε_k,cᵀ removed from every layer's scores; ``reference`` and ``weights_only``: the window's R and
    (W, fp16) :class:`~wkvlab.explain.cells.PassRecord`. ``observe`` sees each layer's scores and the term."""
    from wkvlab.eval.logits import model_logits
    from wkvlab.kv.override import attention_inputs, attention_override
    from wkvlab.formats.hadamard import rotate
    from wkvlab.runtime import input_device

    with attention_inputs(model) as inputs:
        def attention(backend, module, query, key, value, attention_mask, **kwargs):
            layer, store = module.layer_idx, stores[module.layer_idx]
            seen = inputs.get(layer, {})
            scaling = kwargs.get("scaling") or module.scaling
            q, k_full, k_stored, v_full, v_stored = store.apply(query, key, value, seen.get("position_embeddings"), seen.get("residual"))
            device, heads = q.device, q.shape[1]
            q_ref, _ = to_store_space(store, reference.raw[layer][0].to(device), reference.raw[layer][1].to(device))
            _, k_w = to_store_space(store, weights_only.raw[layer][0].to(device), weights_only.raw[layer][1].to(device))
            work = torch.promote_types(query.dtype, torch.float32)
            up = lambda x: _expand(x, heads)[0].to(work)  # noqa: E731
            q, q_ref, k_stored, k_full, k_w, v_stored, v_full = map(up, (q, q_ref, k_stored, k_full, k_w, v_stored, v_full))
            sides = store.selection
            positions = torch.arange(q.shape[-2], device=device)
            use_k = sides.k(positions, k_stored.shape[-2]) if sides is not None and sides.k is not None else None
            use_v = sides.v(positions, v_stored.shape[-2]) if sides is not None and sides.v is not None else None
            before = (q @ k_stored.transpose(-1, -2)) * scaling
            term = cross_cache_term(q, q_ref, k_stored, k_w, scaling)
            if use_k is not None:  # a residual window: the pairs whose key is still full precision
                before = torch.where(use_k, before, (q @ k_full.transpose(-1, -2)) * scaling)
                term = torch.where(use_k, term, cross_cache_term(q, q_ref, k_full, k_w, scaling))
            if observe is not None:
                observe(layer, before, term)
            allowed = allowed_pairs(attention_mask, q.shape[-2], k_stored.shape[-2], device)
            out = scores_attention(before - term, v_stored, allowed, kwargs.get("softcap"), v_full, use_v)
            out = out[None].transpose(1, 2).to(query.dtype)  # [1, tokens, heads, head_dim]
            if store.rot_v:
                out = rotate(out, store.rot_v, inverse=True)
            return out, None

        with attention_override(model, attention):
            return model_logits(model, ids.to(input_device(model))).cpu()


def sinks_kept(kv: KVSpec, n: int = SINK_TOKENS) -> KVSpec:
    """``kv`` with its first ``n`` tokens kept at 16 bits (``+sinks=n``; a spec keeping more already is returned as is)."""
    return kv if kv.sinks >= n else replace(kv, sinks=n)


def token_kld(ref_logits: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """Per-token KLD(reference ‖ cell) of one window's next-token predictions (every position but the last)."""
    from wkvlab.eval.metrics import ReferenceTokens, chunk_metrics

    targets = ids[0, 1:].to(ref_logits.device)
    ref = ReferenceTokens.from_logits(ref_logits[:-1], targets)
    return chunk_metrics(ref, logits[:-1])["kld"].double().cpu().numpy()




@torch.no_grad()
def cache_logits(model: torch.nn.Module, kv: KVSpec, ids: torch.Tensor, stores: list[LayerStore]) -> torch.Tensor:
    """Float32 logits of one window under ``kv`` (the plain teacher-forced simulation)."""
    from wkvlab.eval.logits import model_logits
    from wkvlab.kv.hook import kv_quantization
    from wkvlab.runtime import input_device

    with kv_quantization(model, kv, stores=stores):
        return model_logits(model, ids.to(input_device(model))).cpu()


@torch.no_grad()
def window_cells(candidate: torch.nn.Module, kv: KVSpec, ids: torch.Tensor, stores: list[LayerStore], sink_stores: list[LayerStore] | None,
                 cells, *, weights_label: str = "W", sink_tokens: int = SINK_TOKENS):
    """Every measurement of one (W, C) pair on one window: the W+C pass's decomposition against the recorded
    cells ``(R, W, C)`` (with logits), the run with ε_q·ε_k,cᵀ removed, the run with the sinks at 16 bits.

    Returns ``(decomposition, kld, attention_kl)``: the window's
    :class:`~wkvlab.explain.attention.AttentionDecomposition`, per-token KLD of each of :data:`CELLS`, the
    mean attention-row KL of each of :data:`ATTENTION_CELLS`. ``sink_stores``: for :func:`sinks_kept`
    ``(kv)``; None when ``kv`` already keeps them (the run is the plain one)."""
    from wkvlab.explain.attention import _Accumulator, decompose_window

    ref, w, c = cells
    cfg = candidate.config.get_text_config()
    acc = _Accumulator(cfg.num_hidden_layers, cfg.num_attention_heads)
    logits_wc = decompose_window(candidate, kv, ids, stores, cells, acc, sink_tokens)
    removed = intervened_logits(candidate, kv, ids, stores, ref, w)
    sinks = logits_wc if sink_stores is None else cache_logits(candidate, sinks_kept(kv, sink_tokens), ids, sink_stores)
    decomposition = acc.result(weights_label, kv.label, ids, sink_tokens)
    kld = {"w": token_kld(ref.logits, w.logits, ids), "c": token_kld(ref.logits, c.logits, ids), "wc": token_kld(ref.logits, logits_wc, ids),
           "wc_removed": token_kld(ref.logits, removed, ids), "wc_sinks": token_kld(ref.logits, sinks, ids)}
    return decomposition, kld, {cell: decomposition.kl_of(cell) for cell in ATTENTION_CELLS}



@torch.no_grad()
def decompose_and_intervene(reference: torch.nn.Module, candidate: torch.nn.Module, kv: KVSpec, tokens: torch.Tensor, *,
                            weights_label: str, stats=None, reference_stats=None, margin: float | None = None, kld_margin=None,
                            progress=None):
    """``wkvlab explain``'s attention step: the decomposition of each window ``tokens`` ``[n, ctx]`` and the
    interventions on it, pooled. Returns ``(AttentionDecomposition, CrossTerm)``; the cross term's five effects
    are one Holm family. ``stats``/``reference_stats``: KV calibration under the candidate's / the reference's weights.
    ``kld_margin``: the KLD effects' margin, when another measurement set it (explain: the factorial's)."""
    from wkvlab.explain.attention import pooled
    from wkvlab.explain.cells import record_pass
    from wkvlab.explain.crossterm import CrossTermData, cross_terms
    from wkvlab.kv.hook import layer_stores
    from wkvlab.stats.decision import DEFAULT_MARGIN

    tick = progress or (lambda _d, _n: None)
    fp16 = KVSpec.parse("fp16")
    stores = layer_stores(candidate, kv, stats)
    ref_stores = layer_stores(reference, kv, reference_stats if reference_stats is not None else stats)
    kept = sinks_kept(kv)
    sink_stores = None if kept == kv else layer_stores(candidate, kept, stats)
    parts, data = [], CrossTermData.empty()
    for w in range(tokens.shape[0]):
        ids = tokens[w : w + 1]
        cells = (record_pass(reference, fp16, ids), record_pass(candidate, fp16, ids), record_pass(reference, kv, ids, ref_stores))
        decomposition, kld, attention_kl = window_cells(candidate, kv, ids, stores, sink_stores, cells, weights_label=weights_label)
        parts.append(decomposition)
        data.add(kld, attention_kl)
        tick("attention decomposition and interventions", 1)
    (cross,) = cross_terms([(weights_label, kv.label, data)], family=f"{weights_label} × {kv.label}: cross-term effects",
                           margin=DEFAULT_MARGIN if margin is None else margin, kld_margin=kld_margin)
    return pooled(parts), cross


__all__ = ["cache_logits", "cross_cache_term", "decompose_and_intervene", "intervened_logits", "intervened_scores", "scores_attention", "sinks_kept", "token_kld",
           "window_cells"]
