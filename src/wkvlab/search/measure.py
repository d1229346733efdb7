"""Measuring candidates: KLD against the unquantized reference on fixed windows, and weight swaps.

:class:`Scorer` runs every window chunk by chunk through a cache, as the evaluation runner does
(:mod:`wkvlab.eval.chunks`): no window's ``[ctx, vocab]`` logits exist. It keeps the reference's
per-chunk log-probabilities for the next candidate when all of them fit ``REFERENCE_CACHE_BYTES``,
because a profile scores hundreds of candidates on the same few windows; a longer run steps the
reference's pass beside each candidate instead (twice the forwards, the same memory as eval). Only
the log-probabilities are kept: the probabilities are their ``exp``, recomputed per chunk (the same
operation on the same tensor as :meth:`ReferenceTokens.from_logits`, so bit-identical), which halves
the kept bytes — the search finding's 16 held-out windows of SmolLM2 (1.6 GB with both) fit in 1 GiB,
and no held-out score pays for a second forward.

:class:`WeightSwap` measures *where* weight quantization hurts without re-quantizing: it holds a
copy of the reference and writes back, for the chosen layers or modules only, the tensors the
quantized model changed. For RTN this is exactly "quantize only these layers"; for GPTQ/AWQ it is
"these layers as the full run quantized them" (their error compensation and folded scales included,
since every changed tensor of the layer is swapped). Activation quantizers are hooks, not tensors,
and are not part of a swap (the profile says so).
"""
from __future__ import annotations

import copy
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.eval.chunks import WindowPass, auto_chunk, scored_chunks
from wkvlab.eval.metrics import ReferenceTokens, chunk_metrics
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.spec import KVSpec
from wkvlab.runtime import release_freed_heap
from wkvlab.search.memory import REFERENCE_CACHE_BYTES


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Score:
    """Mean per-token KLD, its standard error (tokens as independent, as llama.cpp) and the token count.

    ``per_token`` and ``windows`` (not serialized) let two scores on the same windows be compared
    with paired draws (:func:`paired_draws`), decided by the rule every wkvlab verdict follows (wkvlab.stats.decide).
    """

    kld: float
    se: float
    tokens: int
    per_token: np.ndarray | None = field(default=None, repr=False, compare=False)
    windows: np.ndarray | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {"kld": self.kld, "se": self.se, "tokens": self.tokens}


def paired_draws(a: Score, b: Score | None = None):
    """Draws of ``a − b`` in mean KLD, paired over windows (``b`` None: of ``a``'s own KLD on the same windows,
    what a margin relative to it is a share of); None without per-token arrays."""
    from wkvlab.stats import resample

    if b is None:
        return None if a.per_token is None else resample(lambda m: m["a"], {"a": a.per_token}, a.windows)
    if a.per_token is None or b.per_token is None or a.per_token.shape != b.per_token.shape:
        return None
    return resample(lambda m: m["a"] - m["b"], {"a": a.per_token, "b": b.per_token}, a.windows)



class Scorer:
    def __init__(self, reference: torch.nn.Module, windows: WindowSet, chunk: int | None = None):
        self.reference = reference
        self.windows = windows
        self.vocab = reference.config.get_text_config().vocab_size
        self.chunk = chunk
        self.keep = windows.n_scored * self.vocab * 4 <= REFERENCE_CACHE_BYTES
        self._refs: dict[tuple[int, int, int], ReferenceTokens] = {}  # (chunk size, window, chunk start): probs dropped

    @property
    def span(self) -> tuple[int, int]:
        return self.windows.score_from, self.windows.ctx - 1

    def _chunk_for(self, kv: KVSpec | None) -> int:
        return self.chunk or auto_chunk(self.vocab, self.windows.ctx, [kv] if kv is not None else [])

    def _references(self, w: int, tokens: torch.Tensor, chunk: int):
        """The reference's chunks of window ``w``: kept from an earlier score, or stepped now."""
        lo, hi = self.span
        cached = [self._refs.get((chunk, w, start)) for start in range(0, self.windows.ctx, chunk)]
        if all(ref is not None for ref in cached):
            for ref in cached:
                yield replace(ref, probs=ref.logprobs.exp())
            return
        for start, rows, logits in scored_chunks(WindowPass(self.reference), tokens, chunk, lo, hi):
            ref = ReferenceTokens.from_logits(logits, tokens[start + rows.start + 1 : start + rows.stop + 1])
            if self.keep:
                self._refs[(chunk, w, start)] = replace(ref, probs=None)
            yield ref

    @torch.no_grad()
    def score(self, model: torch.nn.Module, kv: KVSpec | None = None) -> Score:
        """KLD of ``model`` with the KV cache as ``kv`` stores it (None: untouched) against the reference."""
        lo, hi = self.span
        chunk = self._chunk_for(kv)
        candidate = WindowPass(model, kv, layer_stores(model, kv) if kv is not None else None)
        parts, windows = [], []
        for w, tokens in enumerate(self.windows.tokens):
            chunks = zip(self._references(w, tokens, chunk), scored_chunks(candidate, tokens, chunk, lo, hi))
            kld = torch.cat([chunk_metrics(ref, logits)["kld"] for ref, (_, _, logits) in chunks])
            parts.append(kld.double().cpu().numpy())  # one read-back per window
            release_freed_heap()  # freed chunk tensors under 32 MiB would stay resident (wkvlab.runtime)
            windows.append(np.full(parts[-1].size, w))
        kld = np.concatenate(parts)
        se = float(kld.std(ddof=1) / np.sqrt(kld.size)) if kld.size > 1 else float("nan")
        return Score(float(kld.mean()), se, int(kld.size), kld, np.concatenate(windows))


def layer_of(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


class WeightSwap:
    """A reference copy into which chosen quantized tensors are written, and taken out again."""

    def __init__(self, reference: torch.nn.Module, quantized: torch.nn.Module):
        self.model = copy.deepcopy(reference)
        self._reference = reference.state_dict()  # the originals a swap is undone from: no clone per swap
        self._quantized = {k: v for k, v in quantized.state_dict().items() if k in self._reference and not torch.equal(self._reference[k], v)}
        self._params = dict(self.model.state_dict())

    @property
    def changed(self) -> list[str]:
        """Names of the tensors the quantized model changed (decoder weights, folded norms, ...)."""
        return list(self._quantized)

    @contextmanager
    def only(self, select: Callable[[str], bool]) -> Iterator[torch.nn.Module]:
        """The reference with the quantized tensors whose names ``select`` accepts; restored on exit."""
        names = [n for n in self._quantized if select(n)]
        with torch.no_grad():
            for n in names:
                self._params[n].copy_(self._quantized[n])
        try:
            yield self.model
        finally:
            # undone from the reference's own tensors (the copy was made from them): cloning the
            # swapped ones first held every MLP weight twice while the "mlp" group was scored
            with torch.no_grad():
                for n in names:
                    self._params[n].copy_(self._reference[n])
