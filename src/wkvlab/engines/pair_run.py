"""Engine against engine over all windows, and the paired KV deltas between candidates.

The loop is :func:`wkvlab.engines.run.evaluate_engine`'s with the reference replaced by an engine:
per window the reference engine scores the tokens once, every candidate scores the same tokens,
and :func:`wkvlab.engines.pair.compare_pair` compares each with the reference. No transformers
model is loaded; the windows come from the tokenizer alone (:mod:`wkvlab.engines.tokens`).

**KV deltas.** With several candidates — the same weights served with a 16-bit cache first and
quantized caches after it, as the seed study added the KV penalty on top of each checkpoint —
each later candidate gets ``kv_delta``: its KLD minus the first candidate's, prompt (window) by
prompt on the tokens both scored, with a paired bootstrap interval over documents where the text has
them, windows otherwise (:func:`wkvlab.stats.paired_interval`; tokens of a window, and windows of
one document, are correlated). It is an interval, not a verdict: no margin is applied here.
With top-k sides both KLDs are lower bounds, and so their difference estimates the KV penalty only
as far as both bounds are tight: the tail masses say how tight.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from wkvlab.engines.base import Engine, WindowScores
from wkvlab.engines.pair import compare_pair
from wkvlab.engines.run import EngineEvalResult, engine_result
from wkvlab.engines.tokens import TokenWorkload
from wkvlab.eval.runner import Progress
from wkvlab.stats.bootstrap import Units, paired_interval


def describe_engine(engine: Engine) -> dict:
    """What identifies an engine in a result's ``reference`` block."""
    info = engine.info
    return {"name": info.engine, "version": info.version, "kv": info.kv, **info.details}


def _bound_note(ref_topk: int, cand_topk: int) -> str | None:
    if ref_topk and cand_topk:
        return f"the tokens both engines reported (reference top-{ref_topk}, candidate top-{cand_topk}, + the scored token) and one rest bucket"
    if ref_topk:
        return f"the reference's top-{ref_topk} log-probs (+ the scored token) and one rest bucket"
    return None  # candidate top-k against a full reference: run.py's wording


@torch.no_grad()
def evaluate_pair(reference: Engine, candidates: list[Engine], work: TokenWorkload, *, score_from: int = 0,
                  progress: Progress | None = None) -> list[EngineEvalResult]:
    """Every candidate against the reference engine on every window of ``work``; results in candidate order."""
    tick = progress or (lambda _d, _n: None)
    windows = work.windows
    start_at = max(score_from, windows.score_from)
    parts: list[list] = [[] for _ in candidates]
    seconds = [0.0] * len(candidates)
    ref_topk, cand_topk = 0, [0] * len(candidates)
    started = time.perf_counter()
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        ref: WindowScores = reference.score_window(tokens, start_at)
        ref_topk = ref.topk
        tick("reference", 1)
        for c, engine in enumerate(candidates):
            t0 = time.perf_counter()
            scores = engine.score_window(tokens, start_at)
            seconds[c] += time.perf_counter() - t0
            cand_topk[c] = scores.topk
            parts[c].append(compare_pair(ref, scores, tokens))
            tick(engine.info.kv, 1)
    wall = time.perf_counter() - started
    fingerprints = {"model_sha256": work.fingerprint, "data_sha256": work.corpus.sha256}
    results = [
        engine_result(engine.info, parts[c], windows, topk=max(ref_topk, cand_topk[c]), model=work.name, data=work.corpus.name,
                      fingerprints=fingerprints, engine_seconds=seconds[c], wall_seconds=wall, shape=None,
                      reference=describe_engine(reference), bound_note=_bound_note(ref_topk, cand_topk[c]))
        for c, engine in enumerate(candidates)
    ]
    for result in results[1:]:
        result.kv_delta = kv_delta(results[0], result)
    return results


def _shared_tokens(a: EngineEvalResult, b: EngineEvalResult) -> tuple[np.ndarray, np.ndarray]:
    """Indices into ``a`` and ``b`` of the (window, position) pairs both scored, in window order."""
    stride = int(max(a.arrays.position.max(initial=0), b.arrays.position.max(initial=0))) + 1
    key_a = a.arrays.window.astype(np.int64) * stride + a.arrays.position
    key_b = b.arrays.window.astype(np.int64) * stride + b.arrays.position
    _, ia, ib = np.intersect1d(key_a, key_b, assume_unique=True, return_indices=True)
    return ia, ib


def kv_delta(baseline: EngineEvalResult, result: EngineEvalResult) -> dict:
    """``result`` minus ``baseline`` on the tokens both scored: KLD and top-1, paired over windows, and per prompt."""
    ia, ib = _shared_tokens(baseline, result)
    windows = baseline.arrays.window[ia]
    units = baseline.arrays.units  # documents where the text has them, windows otherwise
    units = Units(np.asarray(units.labels)[ia], units.kind)
    arrays = {"base_kld": baseline.arrays.kld[ia], "kld": result.arrays.kld[ib],
              "base_top1": baseline.arrays.top1_agree[ia].astype(np.float64), "top1": result.arrays.top1_agree[ib].astype(np.float64)}
    kld = paired_interval(lambda m: m["kld"] - m["base_kld"], arrays, units)
    top1 = paired_interval(lambda m: m["top1"] - m["base_top1"], arrays, units)
    per_prompt = []
    for w in np.unique(windows):
        mask = windows == w
        base, cand = float(arrays["base_kld"][mask].mean()), float(arrays["kld"][mask].mean())
        per_prompt.append({"window": int(w), "tokens": int(mask.sum()), "kld_baseline": base, "kld": cand, "kld_delta": cand - base})
    return {"baseline": baseline.kv, "tokens": int(ia.size), "kld": kld.to_dict(), "top1": top1.to_dict(), "per_prompt": per_prompt,
            "both_bounds": baseline.kld_method != "full" or result.kld_method != "full"}
