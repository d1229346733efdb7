"""Attention where each query sees some keys quantized and others at full precision.

A residual window (KIVI, HF's QuantizedCache, SKVQ) keeps the R most recent tokens at full
precision: token j is still full precision when query t attends if ``t - j < R``, and quantized
once it has aged out. Which version of a key a query sees therefore depends on the query, and no
single quantized K tensor can express it. Here both versions enter the product and a per-(query,
key) selection picks one:

    scores[t, j] = q_t · (K_q[j] if quantized[t, j] else K[j]) * scaling (+ mask)
    out[t]       = Σ_j softmax(scores)[t, j] · (V_q[j] if quantized[t, j] else V[j])

Keys and values may follow different rules (KIVI flushes keys in blocks and keeps a sliding
window of values), so ``selection`` is either one function for both sides or a
:class:`KVSelection` with one per side (None: that side is always seen quantized).

Queries are processed in chunks so the [heads, chunk, keys] score blocks stay small at 8k context.
This is an eager implementation (float32 softmax like transformers' eager path), so it is close
to, not bit-identical with, sdpa; the fast path (no query-dependent selection) keeps the model's
own backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Selection = Callable[[torch.Tensor, int], torch.Tensor]  # (query positions [Tc], n_keys) -> bool [Tc, S]


@dataclass(frozen=True)
class KVSelection:
    """Per-side selections; ``None`` on a side means every key (value) is seen quantized."""

    k: Selection | None = None
    v: Selection | None = None


def sliding_selection(window: int) -> Selection:
    """Key j is quantized for query t once it is at least ``window`` tokens old (SKVQ's window)."""

    def select(query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        return (query_pos[:, None] - key_pos[None, :]) >= window

    return select


def flush_selection(residual: int) -> Selection:
    """KIVI's and HF QuantizedCache's residual: full-precision tokens pile up and are quantized
    all at once when ``residual`` of them have accumulated.

    Token t is decoded with the cache holding 0..t-1 plus itself in the full-precision part; after
    attending, a full residual is flushed. So query t sees keys below ``(t // residual) * residual``
    quantized — between 0 and ``residual - 1`` recent tokens stay full precision, not a fixed window.
    """

    def select(query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        return key_pos[None, :] < (query_pos[:, None] // residual) * residual

    return select


def past_only(selection: Selection | None) -> Selection:
    """WKVQuant's past-only rule on top of ``selection``: a query never sees its own token quantized."""

    def select(query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        past = key_pos[None, :] < query_pos[:, None]
        return past if selection is None else past & selection(query_pos, n_keys)

    return select


def _side_mask(selection: Selection | None, query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
    if selection is None:
        return torch.ones(len(query_pos), n_keys, dtype=torch.bool, device=query_pos.device)
    return selection(query_pos, n_keys)


def _expand(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _mask_chunk(attention_mask: torch.Tensor | None, rows: slice, query_pos: torch.Tensor, n_keys: int, dtype, key_offset: int = 0) -> torch.Tensor:
    """Additive mask for a chunk of queries: transformers' mask (bool or float) or plain causal."""
    if attention_mask is None:
        key_pos = torch.arange(key_offset, key_offset + n_keys, device=query_pos.device)
        allowed = key_pos[None, :] <= query_pos[:, None]
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
    chunk = attention_mask[:, :, rows, :n_keys]
    if chunk.dtype == torch.bool:
        return torch.zeros(chunk.shape, dtype=dtype, device=chunk.device).masked_fill(~chunk, torch.finfo(dtype).min)
    return chunk.to(dtype)


def mixed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    key_q: torch.Tensor,
    value: torch.Tensor,
    value_q: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float,
    selection: Selection | KVSelection,
    query_offset: int = 0,
    key_offset: int = 0,
    softcap: float | None = None,
    chunk: int = 512,
) -> torch.Tensor:
    """Returns the attention output as ``[batch, queries, heads, head_dim]`` (transformers' layout).

    ``query_offset`` and ``key_offset`` are the absolute positions of the first query and the first
    key passed (chunked evaluation attends a chunk of queries to the keys a cache still holds).
    """
    sides = selection if isinstance(selection, KVSelection) else KVSelection(selection, selection)
    n_rep = query.shape[1] // key.shape[1]
    k, kq, v, vq = (_expand(t.float(), n_rep) for t in (key, key_q, value, value_q))
    n_queries, n_keys = query.shape[2], key.shape[2]
    outputs = []
    for start in range(0, n_queries, chunk):
        rows = slice(start, min(start + chunk, n_queries))
        q = query[:, :, rows].float()
        query_pos = torch.arange(rows.start, rows.stop, device=query.device) + query_offset
        use_kq = _side_mask(sides.k, query_pos, key_offset + n_keys)[None, None, :, key_offset:]  # [1, 1, Tc, S]
        use_vq = use_kq if sides.v is sides.k else _side_mask(sides.v, query_pos, key_offset + n_keys)[None, None, :, key_offset:]
        scores = torch.where(use_kq, q @ kq.transpose(-1, -2), q @ k.transpose(-1, -2)) * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores + _mask_chunk(attention_mask, rows, query_pos, n_keys, scores.dtype, key_offset)
        probs = torch.softmax(scores, dim=-1)
        out = (probs * use_vq) @ vq + (probs * ~use_vq) @ v
        outputs.append(out)
    return torch.cat(outputs, dim=2).transpose(1, 2).to(query.dtype)
