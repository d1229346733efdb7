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

The cache is never copied whole: queries go in chunks, keys and values in blocks, each block
upcast to float32 on its own, with a running (online) softmax over the blocks as flash attention
does — so the temporaries are a few ``[heads, query chunk, key block]`` tensors (about
``SCORE_BLOCK_BYTES``) whatever the context, and grouped-query heads share their key head instead
of repeating it. Arithmetic is float32 (like transformers' eager softmax), so this is close to,
not bit-identical with, sdpa; the fast path (no query-dependent selection) keeps the model's own
backend.
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


def flush_selection(residual: int, prefill: int = 0, prompt_exact: bool = False) -> Selection:
    """KIVI's and HF QuantizedCache's residual: full-precision tokens pile up and are quantized
    all at once when ``residual`` of them have accumulated.

    Token t is decoded with the cache holding 0..t-1 plus itself in the full-precision part; after
    attending, a full residual is flushed. So query t sees keys below ``(t // residual) * residual``
    quantized — between 0 and ``residual - 1`` recent tokens stay full precision, not a fixed window.
    With ``prefill=L`` (QuantizedCache after an L-token prompt) the prompt attends unquantized and
    query t >= L sees keys below ``L + ((t - L) // residual) * residual`` quantized; with
    ``prompt_exact`` (quanto's single-group prompt, :func:`wkvlab.kv.tokens.quanto_prompt_exact`)
    nothing is quantized before the first flush at ``L + residual``.
    """

    def select(query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        if prefill:
            decoded = query_pos[:, None] >= prefill
            bound = prefill + torch.div(query_pos[:, None] - prefill, residual, rounding_mode="floor") * residual
            if prompt_exact:
                decoded = decoded & (bound > prefill)
            return decoded & (key_pos[None, :] < bound)
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


SCORE_BLOCK_BYTES = 32 << 20  # one float32 [batch, heads, query chunk, key block] score block


def _mask_block(attention_mask: torch.Tensor | None, rows: slice, query_pos: torch.Tensor, keys: slice, key_offset: int,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask ``[batch or 1, 1, 1, queries, keys]`` of one block in ``dtype`` (the arithmetic's):
    transformers' mask (bool or float) or plain causal."""
    if attention_mask is None:
        key_pos = torch.arange(key_offset + keys.start, key_offset + keys.stop, device=query_pos.device)
        allowed = key_pos[None, :] <= query_pos[:, None]
        block = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return block[None, None, None]
    block = attention_mask[:, :, rows, keys]
    if block.dtype == torch.bool:
        block = torch.zeros(block.shape, dtype=dtype, device=block.device).masked_fill_(~block, torch.finfo(dtype).min)
    return block.to(dtype)[:, :, None]


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
    batch, heads, n_queries, head_dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    # float32 at least (transformers' eager softmax); a float64 model keeps float64, so its
    # teacher-forced and streamed passes agree to float64 rounding (tests/kv/test_streaming.py)
    work = torch.promote_types(query.dtype, torch.float32)
    lowest = torch.finfo(work).min
    chunk = max(1, min(chunk, n_queries))
    block = max(1, SCORE_BLOCK_BYTES // (4 * batch * heads * chunk))
    outputs = []
    for start in range(0, n_queries, chunk):
        rows = slice(start, min(start + chunk, n_queries))
        # [batch, kv_heads, n_rep, queries, head_dim]: a query head's group shares its key head (no repeat)
        q = query[:, :, rows].to(work).reshape(batch, kv_heads, n_rep, rows.stop - rows.start, head_dim)
        query_pos = torch.arange(rows.start, rows.stop, device=query.device) + query_offset
        use_kq = _side_mask(sides.k, query_pos, key_offset + n_keys)[:, key_offset:]  # [Tc, S]
        use_vq = use_kq if sides.v is sides.k else _side_mask(sides.v, query_pos, key_offset + n_keys)[:, key_offset:]
        running_max = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=work, device=q.device)
        total = torch.zeros_like(running_max)
        acc = torch.zeros_like(q)
        for k0 in range(0, n_keys, block):
            keys = slice(k0, min(k0 + block, n_keys))
            k_blk, kq_blk = (t[:, :, None, keys].to(work) for t in (key, key_q))  # [batch, kv_heads, 1, Kb, head_dim]
            sel_k = use_kq[:, keys]
            scores = torch.where(sel_k, q @ kq_blk.transpose(-1, -2), q @ k_blk.transpose(-1, -2)).mul_(scaling)
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            # masked keys at the dtype's lowest, never -inf: a block masked whole must rescale to 0, not NaN
            scores = (scores + _mask_block(attention_mask, rows, query_pos, keys, key_offset, work)).clamp_(min=lowest)
            new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
            rescale = torch.exp(running_max - new_max)
            probs = torch.exp(scores - new_max)
            total = total * rescale + probs.sum(-1, keepdim=True)
            v_blk, vq_blk = (t[:, :, None, keys].to(work) for t in (value, value_q))
            sel_v = use_vq[:, keys]
            acc = acc * rescale + torch.where(sel_v, probs, 0.0) @ vq_blk + torch.where(sel_v, 0.0, probs) @ v_blk
            running_max = new_max
        outputs.append((acc / total).reshape(batch, heads, rows.stop - rows.start, head_dim))
    return torch.cat(outputs, dim=2).transpose(1, 2).to(query.dtype)
