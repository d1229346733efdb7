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
from wkvlab.eval.logits import model_logits
from wkvlab.eval.memory import MIN_CHUNK, auto_chunk  # noqa: F401 - the chunk size rule, re-exported
from wkvlab.kv.chunked import ChunkedKVCache
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore
from wkvlab.runtime import input_device

def window_tokens(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's ids where the model reads them (its embedding's device) and where its logits come
    out (lm_head's, which differs on a model spread over devices): moved once per window, so a
    chunk's ids and targets are slices on the device, not a host-to-device copy (a synchronization
    on a GPU) per chunk and pass."""
    ids = tokens.to(input_device(model))
    head = model.get_output_embeddings()
    return ids, ids if head is None else ids.to(head.weight.device)


def chunk_bounds(ctx: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of a ``ctx``-token window."""
    return [(start, min(start + chunk, ctx)) for start in range(0, ctx, chunk)]


def scored_rows(start: int, end: int, lo: int, hi: int) -> slice:
    """Rows of a chunk ``[start, end)`` whose query position is scored (``lo <= p < hi``)."""
    return slice(max(lo, start) - start, max(min(hi, end), max(lo, start)) - start)


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
    def step(self, tokens: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """Float32 logits ``[len(tokens), vocab]`` of the next chunk of the window (1-D ``tokens``;
        :func:`wkvlab.eval.logits.model_logits`: the final norm and head in float32); with ``rows``
        only those rows, and no head at all where ``rows`` is empty (an unscored prefix chunk)."""
        ids = tokens[None].to(input_device(self.model))
        with self.baseline.attached(self.model):  # the engine's activation path, on every pass alike
            if self.spec is None:
                return model_logits(self.model, ids, rows, cache=self.cache, use_cache=True)
            with kv_quantization(self.model, self.spec, storage="chunked", stores=self.stores, cache=self.cache):
                return model_logits(self.model, ids, rows, cache=self.cache, use_cache=True)


def scored_chunks(pass_: WindowPass, tokens: torch.Tensor, chunk: int, lo: int, hi: int):
    """One window through ``pass_`` (reset first), chunk by chunk: ``(chunk start, scored rows, their
    float32 logits)`` — what a command that compares two passes zips together, so neither holds a
    window's ``[ctx, vocab]`` logits."""
    pass_.reset()
    tokens = tokens.to(input_device(pass_.model))  # once, not per chunk
    for start, end in chunk_bounds(len(tokens), chunk):
        rows = scored_rows(start, end, lo, hi)
        yield start, rows, pass_.step(tokens[start:end], rows)
