"""Run one window through a model chunk by chunk, as engines prefill long prompts.

A pass is one model (the reference, or a weight-quantized copy) with one KV spec (none for the
reference) over one window. :meth:`WindowPass.step` feeds the next chunk of tokens through the
pass's cache and returns that chunk's logits only, so the caller can reduce them to per-token
metrics before the next chunk runs: the ``[ctx, vocab]`` logits of a window never exist, and peak
memory grows with ctx × hidden (and the KV cache), not ctx × vocab.

Several passes over the same window can be interleaved chunk by chunk (the reference's chunk, then
each candidate's), because each keeps its own cache; the KV hook is entered per chunk, so two
passes that share a weight-quantized model do not hold its attention dispatch at the same time.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline
from wkvlab.kv.chunked import ChunkedKVCache, token_group_multiple
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore
from wkvlab.runtime import input_device

# The chunk's float32 logits (and the log-probabilities derived from them) should stay around this
# size: 256 MiB is 1,365 queries of SmolLM2's 49k vocabulary and 256 of Gemma 3's 262k.
LOGITS_BUDGET_BYTES = 256 << 20
MIN_CHUNK = 64


def auto_chunk(vocab_size: int, ctx: int, specs: list[KVSpec] = ()) -> int:
    """The largest power of two (≥ 64) whose float32 logits fit the budget, a multiple of every
    per-channel token group, and no longer than the window."""
    chunk = MIN_CHUNK
    while chunk * 2 * vocab_size * 4 <= LOGITS_BUDGET_BYTES:
        chunk *= 2
    for spec in specs:
        multiple = token_group_multiple(spec)
        chunk = -(-chunk // multiple) * multiple
    return min(chunk, ctx)


def chunk_bounds(ctx: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of a ``ctx``-token window."""
    return [(start, min(start + chunk, ctx)) for start in range(0, ctx, chunk)]


class WindowPass:
    """One model and KV spec on one window at a time; call :meth:`reset` before each window.

    ``baseline`` (:mod:`wkvlab.eval.baseline`) is attached around every chunk: the engine's own
    activation path (llama.cpp's q8 matmul inputs) when the KLD is against the engine's 16-bit cache.
    """

    def __init__(self, model: torch.nn.Module, spec: KVSpec | None = None, stores: list[LayerStore] | None = None,
                 baseline: Baseline = FLOAT_BASELINE) -> None:
        self.model, self.spec, self.stores, self.baseline = model, spec, stores, baseline
        if spec is not None and stores is None:
            raise ValueError("a KV spec needs its layer stores (wkvlab.kv.hook.layer_stores)")
        self.cache = None
        self.reset()

    def reset(self) -> None:
        """Start a new window with an empty cache."""
        if self.spec is None:
            self.cache = DynamicCache(config=self.model.config)
        else:
            self.cache = ChunkedKVCache(self.model, self.spec, self.stores)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(tokens), vocab]`` of the next chunk of the window (1-D ``tokens``)."""
        ids = tokens[None].to(input_device(self.model))
        with self.baseline.attached(self.model):  # the engine's activation path, on every pass alike
            if self.spec is None:
                return self.model(input_ids=ids, cache=self.cache, use_cache=True).logits[0]
            with kv_quantization(self.model, self.spec, storage="chunked", stores=self.stores, cache=self.cache):
                return self.model(input_ids=ids, cache=self.cache, use_cache=True).logits[0]
