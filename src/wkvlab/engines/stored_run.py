"""A real engine against a stored reference: no reference model in this process at all.

``wkvlab engine eval --reference ref.safetensors`` (a file from ``wkvlab reference save``) cuts the
same windows from the tokenizer alone (:mod:`wkvlab.engines.tokens`), checks them against the
windows the file was made on, and compares each window the engine scores with the file:

* an engine that returns full logits (llama.cpp in-process) is compared as ``wkvlab eval
  --reference`` compares a simulation (:func:`wkvlab.eval.reference.compare_stored`): NLL, top-1
  and Δp exact, KLD = the top-k head exact + the sampled tail, with its sampling standard error;
* an engine that returns top-k log-probs (HTTP servers) is compared through the engine-against-
  engine lower bound (:mod:`wkvlab.engines.pair`), the file standing in for a reference engine
  that reports its top-k.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from wkvlab.engines.base import Engine, EngineInfo, WindowScores
from wkvlab.engines.bridge import WindowComparison
from wkvlab.engines.pair import compare_pair
from wkvlab.engines.run import EngineEvalResult, engine_result
from wkvlab.engines.tokens import TokenWorkload
from wkvlab.eval.reference import StoredReference, compare_stored, windows_fingerprint
from wkvlab.eval.runner import ModelShape, Progress


class StoredReferenceEngine:
    """The stored reference as an engine that reports its top-k (for top-k candidates)."""

    def __init__(self, stored: StoredReference, windows) -> None:
        self.stored, self.windows = stored, windows
        self.info = EngineInfo("stored-reference", stored.meta.get("format", ""), "reference", {"k": stored.k})

    def rows(self, window: int) -> slice:
        per = self.windows.scored_per_window
        return slice(window * per, (window + 1) * per)

    def scores(self, window: int) -> WindowScores:
        rows = self.rows(window)
        positions = torch.arange(self.windows.score_from, self.windows.ctx - 1)
        return WindowScores(positions=positions, ids=self.stored.topk_ids[rows].long(), logprobs=self.stored.topk_logprobs[rows].double(),
                            topk=self.stored.k)


def evaluate_against_stored(engine: Engine, stored: StoredReference, work: TokenWorkload, *, score_from: int = 0,
                            progress: Progress | None = None, shape: ModelShape | None = None) -> EngineEvalResult:
    """Score every window of ``work`` with ``engine`` and compare it with the stored reference."""
    windows = work.windows
    stored.check_matches({"windows_sha256": windows_fingerprint(windows.tokens, windows.score_from), "ctx": windows.ctx,
                          "data_sha256": work.corpus.sha256})
    tick = progress or (lambda _d, _n: None)
    as_engine = StoredReferenceEngine(stored, windows)
    start_at = max(score_from, windows.score_from)
    parts: list[WindowComparison] = []
    seconds, topk, started = 0.0, 0, time.perf_counter()
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        t0 = time.perf_counter()
        scores = engine.score_window(tokens, start_at)
        seconds += time.perf_counter() - t0
        topk = scores.topk
        if scores.full:
            rows = as_engine.rows(w)
            offset = int(scores.positions[0]) - windows.score_from  # the engine may start later (start_at)
            first = rows.start + offset
            ref = stored.chunk(first, first + scores.positions.numel())
            found = compare_stored(ref, scores.logits, tokens[scores.positions + 1])
            parts.append(WindowComparison(found.metrics, 1.0 - np.exp(stored.topk_logprobs[first: first + scores.positions.numel()]
                                                                        .double().numpy()).sum(-1), scores.positions.numpy()))
        else:
            parts.append(compare_pair(as_engine.scores(w), scores, tokens))
        tick(engine.info.engine, 1)
    reference = {"name": "stored-reference", "k": stored.k, "samples": stored.meta.get("samples"), "model": stored.meta.get("model"),
                 "dtype": stored.meta.get("dtype")}
    note = None if topk else f"the stored reference's top-{stored.k} log-probs and {stored.meta.get('samples')} sampled tail tokens per position"
    result = engine_result(engine.info, parts, windows, topk=topk, model=work.name, data=work.corpus.name,
                           fingerprints={"model_sha256": stored.meta.get("model_sha256", work.fingerprint), "data_sha256": work.corpus.sha256},
                           engine_seconds=seconds, wall_seconds=time.perf_counter() - started, shape=shape, reference=reference,
                           bound_note=note if topk else None)
    if not topk:
        result.kld_method = "stored-reference"
        result.notes.append(f"KLD against the stored reference ({stored.tokens:,} tokens, top-{stored.k}): the head exact, the tail "
                            f"estimated from {stored.meta.get('samples')} sampled tokens per position; NLL, top-1 and Δp exact")
    return result
