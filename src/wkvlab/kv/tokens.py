"""Which cached tokens a query sees quantized — one policy for the keys, one for the values.

A quantize-on-write cache (llama.cpp, vLLM, ExLlamaV3) stores every token quantized, the one being
decoded included. Methods that keep recent tokens at model precision differ in *how*:

* ``residual=R`` (flushed): full-precision tokens pile up and are quantized together once R of
  them have accumulated, so query t sees keys below ``(t // R) * R`` quantized — KIVI's keys
  (``models/llama_kivi.py``: ``key_states_full`` flushed when it reaches ``residual_length``) and
  transformers' ``QuantizedCache``.
* ``window=W`` (sliding): the W most recent tokens, the query's own included, stay at model
  precision — KIVI's values (``value_states_full`` holds the last R values before the new one is
  appended and the oldest is quantized after attending, so a query sees R + 1 values at full
  precision: W = R + 1) and SKVQ.
* ``pastonly``: the token being decoded attends to its own K/V at model precision and is stored
  quantized afterwards (WKVQuant's past-only quantization; the paper publishes no code we could find).
* ``prefill=L`` with a residual (transformers' ``QuantizedCache``, ``cache_utils.py`` 5.24
  ``QuantizedLayer.update``): the first update quantizes the whole L-token prompt but returns it
  unquantized, so the prompt attends at model precision; decoded tokens then pile up in the
  residual, and when R have (``residual + new >= residual_length``) the whole cache is re-quantized.
  Query t >= L sees keys below ``L + R * ((t - L) // R)`` quantized, query t < L none.
  ``prompt_exact``: with the quanto backend, a prompt tensor of exactly one quantization group
  (``batch · kv_heads · L · head_dim == q_group_size``, e.g. a one-token prompt on one KV head of
  64, Falcon-7B's shape) goes through optimum-quanto's degenerate path and is stored exactly (see
  :func:`quanto_prompt_exact`): the prompt is first quantized at the first flush, so query t sees
  nothing quantized before ``L + R``.

Per-channel formats (KIVI's ``int<b>-c<G>`` keys) need a closed group of G tokens before it can be
quantized, so a side holding one is flushed in multiples of G. Everything here is a pure function
of (query positions, key count) or of (position, new tokens): the teacher-forced hook and the
streaming cache both use it, which is what keeps them equal (tested).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the selections are tensor code; a spec that only parses or plans must not load torch
    from wkvlab.kv.attention import Selection


@dataclass(frozen=True)
class TokenPolicy:
    """One side's rule (keys or values); all zero/False: every token stored quantized on write."""

    residual: int = 0
    window: int = 0
    pastonly: bool = False
    prefill: int = 0  # with a residual: the prompt length of transformers' QuantizedCache
    prompt_exact: bool = False  # with prefill: the prefill quantization kept the prompt exact (quanto's single group)

    @property
    def depends_on_query(self) -> bool:
        return bool(self.residual or self.window or self.pastonly)

    def selection(self) -> Selection | None:
        """Bool ``[queries, keys]`` function: True where the query sees the key quantized (None: always)."""
        if not self.depends_on_query:
            return None
        from wkvlab.kv.attention import flush_selection, past_only, sliding_selection

        base = sliding_selection(self.window) if self.window else flush_selection(self.residual, self.prefill, self.prompt_exact) if self.residual else None
        return past_only(base) if self.pastonly else base

    def quantized_prefix(self, position: int, n_new: int) -> int:
        """How many leading tokens are stored quantized when the query at ``position`` attends.

        ``position`` is the first of ``n_new`` tokens written in this step (a prefill chunk
        attends to itself at model precision, as engines' prefill does).
        """
        if self.window:
            return max(0, position - self.window + 1)
        if self.residual and self.prefill:
            bound = 0 if position < self.prefill else self.prefill + (position - self.prefill) // self.residual * self.residual
            return 0 if (self.prompt_exact and bound == self.prefill) else bound
        if self.residual:
            return (position // self.residual) * self.residual
        return position if self.pastonly else position + n_new


def side_policy(residual: int, window: int, pastonly: bool, token_group: int | None, prefill: int = 0) -> TokenPolicy:
    """A side's policy given its format: a per-channel format flushes at least its token group."""
    if token_group and not residual:
        residual = token_group
    return TokenPolicy(residual=residual, window=window, pastonly=pastonly, prefill=prefill if residual else 0)



def quanto_prompt_exact(prompt_values: int, group: int | None) -> bool:
    """Whether optimum-quanto stores a QuantizedCache prompt of ``prompt_values`` values (batch ·
    kv_heads · prompt length · head_dim) exactly, given the format's group of ``group`` values.

    huggingface/optimum-quanto v0.2.7 (@089d86ef), ``optimum/quanto/tensor/optimizers/affine_optimizer.py``
    ``AffineOptimizer.__call__``: after ``group(base, axis=0, group_size)`` reshapes the tensor to
    ``[numel / group_size, group_size]``, ``if axis is not None and base.shape[axis] == 1: axis = None``;
    ``MaxOptimizer.optimize`` then reduces over dim 0 only (``list(range(0, base.ndim - 1))``), so every
    value is its own min and max: ``scale = 0``, ``shift = -x``. ``library/quantize.py``
    ``quantize_affine``: ``round((x + shift) / scale)`` is ``round(0/0)``, NaN, stored as code 0;
    ``tensor/qbits.py`` ``QBitsDequantizer``: ``scale * 0 - shift`` = x, exactly. transformers 5.24
    ``QuantoQuantizedLayer._quantize`` calls it on the whole prompt ``[batch, kv_heads, L, head_dim]``.
    """
    return bool(group) and prompt_values == group


def token_group_multiple(spec) -> int:
    """A chunked pass's chunk size must be a multiple of this (1 unless a per-channel format of the
    :class:`~wkvlab.kv.spec.KVSpec` groups tokens)."""
    groups = [f.token_group for f in spec.all_formats() if f.token_group]
    return math.lcm(*groups) if groups else 1
