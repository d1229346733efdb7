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

All keys go into one product per group of queries, so the work per call is a fixed handful of
kernels, not a Python loop over key blocks (a Llama-3-8B layer's 512-query chunk against 128k keys:
11,534 non-view ops for the blocked online softmax this replaces, 309 now; docs/gpu.md). Grouped-query
heads share their key head without a copy: a group's query heads are stacked as rows of one
``[batch, kv_heads, n_rep × queries, head_dim]`` matrix. Every rule here quantizes a prefix of the
keys for each query (keys older than a bound, the bound never decreasing with the query), so for
a group of queries starting at ``t0`` the keys before the bound at ``t0`` are seen quantized by
all of them: only the band after it gets the second (full-precision) product and the per-query
selection. Arithmetic is float32 at least (like transformers' eager softmax), so this is close
to, not bit-identical with, sdpa; the fast path (no query-dependent selection) keeps the model's
own backend.

Memory: the quantized K and V upcast once per call (none for a float32 model), and two
``[batch, heads, query group, keys]`` score tensors (the scores and their softmax). The query
group is sized so those take at most :func:`wkvlab.kv.attention_sizes.score_budget` bytes: the
size of the expanded K/V that ``repeat_kv`` makes on the sdpa path (what the estimate counts for it), or 256 MiB where
that is less — so at every context a 512-query chunk takes a few groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from wkvlab.kv.attention_sizes import query_group

Selection = Callable[[torch.Tensor, int], torch.Tensor]  # (query positions [Tc], n_keys) -> bool [Tc, S]


@dataclass(frozen=True)
class KVSelection:
    """Per-side selections; ``None`` on a side means every key (value) is seen quantized."""

    k: Selection | None = None
    v: Selection | None = None


@dataclass(frozen=True)
class SlidingSelection:
    """Key j is quantized for query t once it is at least ``window`` tokens old (SKVQ's window)."""

    window: int

    def __call__(self, query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        return (query_pos[:, None] - key_pos[None, :]) >= self.window

    def prefix(self, t: int) -> int:
        """Keys below this are quantized for query ``t`` and every later query."""
        return max(0, t - self.window + 1)


@dataclass(frozen=True)
class FlushSelection:
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

    residual: int
    prefill: int = 0
    prompt_exact: bool = False

    def __call__(self, query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        residual, prefill = self.residual, self.prefill
        if prefill:
            decoded = query_pos[:, None] >= prefill
            bound = prefill + torch.div(query_pos[:, None] - prefill, residual, rounding_mode="floor") * residual
            if self.prompt_exact:
                decoded = decoded & (bound > prefill)
            return decoded & (key_pos[None, :] < bound)
        return key_pos[None, :] < (query_pos[:, None] // residual) * residual

    def prefix(self, t: int) -> int:
        if not self.prefill:
            return (t // self.residual) * self.residual
        bound = self.prefill + ((t - self.prefill) // self.residual) * self.residual
        decoded = t >= self.prefill and (bound > self.prefill or not self.prompt_exact)
        return bound if decoded else 0


@dataclass(frozen=True)
class PastOnlySelection:
    """WKVQuant's past-only rule on top of ``base``: a query never sees its own token quantized."""

    base: Selection | None = None

    def __call__(self, query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        key_pos = torch.arange(n_keys, device=query_pos.device)
        past = key_pos[None, :] < query_pos[:, None]
        return past if self.base is None else past & self.base(query_pos, n_keys)

    def prefix(self, t: int) -> int:
        return t if self.base is None else min(t, _prefix(self.base, t))


def sliding_selection(window: int) -> Selection:
    return SlidingSelection(window)


def flush_selection(residual: int, prefill: int = 0, prompt_exact: bool = False) -> Selection:
    return FlushSelection(residual, prefill, prompt_exact)


def past_only(selection: Selection | None) -> Selection:
    return PastOnlySelection(selection)


def _prefix(selection: Selection | None, t: int) -> float:
    """How many leading keys every query from ``t`` on sees quantized: all (None), the rule's bound,
    or none for a selection that states no bound (any callable; the band then spans every key)."""
    if selection is None:
        return float("inf")
    prefix = getattr(selection, "prefix", None)
    return prefix(t) if prefix is not None else 0


def _side_mask(selection: Selection | None, query_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
    if selection is None:
        return torch.ones(len(query_pos), n_keys, dtype=torch.bool, device=query_pos.device)
    return selection(query_pos, n_keys)


def _mask_block(attention_mask: torch.Tensor | None, rows: slice, query_pos: torch.Tensor, n_keys: int, key_offset: int,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask ``[batch or 1, 1, 1, queries, keys]`` of one query group in ``dtype`` (the arithmetic's):
    transformers' mask (bool or float) or plain causal."""
    if attention_mask is None:
        key_pos = torch.arange(key_offset, key_offset + n_keys, device=query_pos.device)
        allowed = key_pos[None, :] <= query_pos[:, None]
        block = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return block[None, None, None]
    block = attention_mask[:, :, rows, :n_keys]
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
    chunk: int | None = None,
) -> torch.Tensor:
    """Returns the attention output as ``[batch, queries, heads, head_dim]`` (transformers' layout).

    ``query_offset`` and ``key_offset`` are the absolute positions of the first query and the first
    key passed (chunked evaluation attends a chunk of queries to the keys a cache still holds).
    ``chunk`` caps the queries per group (default: as many as :func:`query_group` allows).
    """
    sides = selection if isinstance(selection, KVSelection) else KVSelection(selection, selection)
    batch, heads, n_queries, head_dim = query.shape
    n_keys = key.shape[2]
    # float32 at least (transformers' eager softmax); a float64 model keeps float64, so its
    # teacher-forced and streamed passes agree to float64 rounding (tests/kv/test_streaming.py)
    work = torch.promote_types(query.dtype, torch.float32)
    group = query_group(batch, heads, n_keys, head_dim, query.element_size(), torch.finfo(work).bits // 8)
    group = max(1, min(group, chunk or group, n_queries))
    kq_all, vq_all = key_q.to(work), value_q.to(work)  # once per call, not per group (no copy when already work)
    out = torch.empty(batch, heads, n_queries, head_dim, dtype=work, device=query.device)
    for start in range(0, n_queries, group):
        rows = slice(start, min(start + group, n_queries))
        # keys before ``lo`` are seen quantized by every query of the group, on both sides (host ints: no sync)
        t0 = query_offset + rows.start
        lo = int(min(max(min(_prefix(sides.k, t0), _prefix(sides.v, t0)) - key_offset, 0), n_keys))
        # a function per group: its temporaries are gone before the next group's scores exist
        out[:, :, rows] = _group(query[:, :, rows].to(work), key, kq_all, value, vq_all, attention_mask, rows, lo, sides, scaling=scaling,
                                 softcap=softcap, query_offset=query_offset, key_offset=key_offset)
    return out.transpose(1, 2).to(query.dtype)


def _group(query: torch.Tensor, key: torch.Tensor, kq_all: torch.Tensor, value: torch.Tensor, vq_all: torch.Tensor,
           attention_mask: torch.Tensor | None, rows: slice, lo: int, sides: KVSelection, *, scaling: float, softcap: float | None,
           query_offset: int, key_offset: int) -> torch.Tensor:
    """One group of queries (``query`` ``[batch, heads, tc, D]`` in the work dtype) against every key:
    the quantized product on all of them, the full-precision one on the band from ``lo``."""
    batch, heads, tc, head_dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    n_rep, work = heads // kv_heads, query.dtype
    # a group's query heads stacked as rows against their shared key head: no repeat of K or V
    q = query.reshape(batch, kv_heads, n_rep * tc, head_dim)
    query_pos = torch.arange(rows.start, rows.stop, device=query.device) + query_offset
    scores = q @ kq_all.transpose(-1, -2)  # [batch, kv_heads, n_rep * tc, keys]
    grid = scores.view(batch, kv_heads, n_rep, tc, n_keys)
    if lo < n_keys:
        use_kq = _side_mask(sides.k, query_pos, key_offset + n_keys)[:, key_offset + lo:]  # [tc, band]
        full = (q @ key[:, :, lo:].to(work).transpose(-1, -2)).view(batch, kv_heads, n_rep, tc, n_keys - lo)
        torch.where(use_kq, grid[..., lo:], full, out=full)
        grid[..., lo:] = full
        del full
    scores.mul_(scaling)
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    # masked keys at the dtype's lowest, never -inf: a query whose every key is masked gets no NaN
    grid.add_(_mask_block(attention_mask, rows, query_pos, n_keys, key_offset, work)).clamp_(min=torch.finfo(work).min)
    probs = torch.softmax(scores, dim=-1)
    del scores, grid
    if lo < n_keys:
        use_vq = _side_mask(sides.v, query_pos, key_offset + n_keys)[:, key_offset + lo:]
        band = probs.view(batch, kv_heads, n_rep, tc, n_keys)[..., lo:]
        seen_full = torch.where(use_vq, 0.0, band)  # the probabilities of values seen at full precision
        band.masked_fill_(~use_vq, 0.0)
        out = probs @ vq_all
        out.add_(seen_full.view(batch, kv_heads, n_rep * tc, n_keys - lo) @ value[:, :, lo:].to(work))
    else:
        out = probs @ vq_all
    return out.view(batch, heads, tc, head_dim)
