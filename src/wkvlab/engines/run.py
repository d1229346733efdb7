"""Evaluate a real engine against the float32 reference, window by window, into an EvalResult.

The loop is the simulation's: windows outside; per window the engine scores the tokens, and the
reference (transformers) runs the same window chunk by chunk through its cache, each chunk's
float32 distributions compared with the engine's positions inside it by :mod:`wkvlab.engines.bridge`. The result is the JSON ``wkvlab eval`` writes, plus an
``engine`` block (what ran) and ``kld_method``: ``full`` (every vocabulary entry, exact) or
``topk-bound`` (a lower bound from the tokens the engine reported, with the reference's mean
``tail_mass`` outside them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wkvlab.api import Workload, prepare
from wkvlab.data.windows import WindowSet, cut_windows
from wkvlab.engines.base import Engine, EngineInfo, WindowScores
from wkvlab.engines.bridge import WindowComparison, compare_window
from wkvlab.errors import ConfigError, DataError
from wkvlab.eval.chunks import WindowPass, auto_chunk, chunk_bounds
from wkvlab.eval.metrics import concat_metrics, position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.eval.runner import ModelShape, Progress
from wkvlab.kv.spec import KVSpec


TRANSFORMERS_REFERENCE = {"name": "transformers", "dtype": "float32"}


@dataclass
class EngineEvalResult(EvalResult):
    """An :class:`EvalResult` whose candidate is a real engine."""

    engine: dict = field(default_factory=dict)
    kld_method: str = "full"
    tail_mass: float = 0.0
    reference: dict = field(default_factory=lambda: dict(TRANSFORMERS_REFERENCE))  # what the candidate was compared with
    kv_delta: dict | None = None  # paired difference to the first candidate of an engine-vs-engine run (pair_run.py)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(engine=self.engine, kld_method=self.kld_method, tail_mass=self.tail_mass, reference=self.reference)
        if self.kv_delta is not None:
            out["kv_delta"] = self.kv_delta
        return out


def with_bos_windows(work: Workload) -> Workload:
    """The same text cut into windows that start with BOS (for servers that need it, see openai.py)."""
    if work.windows.bos:
        return work
    tokenizer = work.loaded.tokenizer
    if tokenizer.bos_token_id is None:
        raise ConfigError(f"{work.loaded.name} has no BOS token, which the llama-cpp-python server needs to align its echo; use --flavor vllm or sglang")
    w = work.windows
    score = "all" if w.score_from == 0 else "second-half"
    windows = cut_windows(work.corpus, tokenizer, ctx=w.ctx, n_tokens=w.n_windows * w.ctx, bos_id=tokenizer.bos_token_id,
                          stride=work.stride, score=score)
    return Workload(work.loaded, work.corpus, windows, work.tokens, work.stride)


def arrays_from(parts: list[WindowComparison], documents: tuple[int, ...] | None = None) -> TokenArrays:
    """Per-token arrays in window order; windows may have different scored positions. ``documents``:
    each window's document (:attr:`WindowSet.documents`), None for one stream."""
    cat = lambda name: np.concatenate([getattr(p.metrics, name) for p in parts])  # noqa: E731
    return TokenArrays(
        kld=cat("kld"), nll_ref=cat("nll_ref"), nll=cat("nll"), top1_agree=cat("top1_agree"), delta_p=cat("delta_p"),
        position=np.concatenate([p.positions for p in parts]),
        window=np.concatenate([np.full(len(p.positions), w) for w, p in enumerate(parts)]),
        document=None if documents is None else np.concatenate([np.full(len(p.positions), documents[w], dtype=np.int64)
                                                                 for w, p in enumerate(parts)]),
    )


def kv_spec_of(info: EngineInfo) -> KVSpec | None:
    """The engine's cache as a KVSpec (for bytes per token), when it is a llama.cpp type pair."""
    if info.engine != "llamacpp":
        return None
    k, v = info.details["type_k"], info.details["type_v"]
    name = lambda t: "fp16" if t in ("f16", "bf16", "f32") else t  # noqa: E731 - 16 bits: the identity
    return KVSpec(k=name(k), v=name(v))


@torch.no_grad()
def evaluate_engine(engine: Engine, work: Workload, *, progress: Progress | None = None, score_from: int | None = None) -> EngineEvalResult:
    """Score every window of ``work`` with ``engine`` and compare with the float32 reference."""
    tick = progress or (lambda _d, _n: None)
    windows: WindowSet = work.windows
    start_at = windows.score_from if score_from is None else max(score_from, windows.score_from)
    parts: list[WindowComparison] = []
    started = time.perf_counter()
    engine_seconds = 0.0
    topk = 0
    reference = WindowPass(work.loaded.model)
    chunk = auto_chunk(work.loaded.model.config.get_text_config().vocab_size, windows.ctx)
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        t0 = time.perf_counter()
        scores = engine.score_window(tokens, start_at)
        engine_seconds += time.perf_counter() - t0
        topk = scores.topk
        parts.append(compare_chunked(reference, tokens, scores, chunk))
        tick("reference", 1)
        tick(engine.info.engine, 1)
    shape = ModelShape.of(work.loaded.model)
    return engine_result(engine.info, parts, windows, topk=topk, model=work.loaded.name, data=work.corpus.name,
                         fingerprints={"model_sha256": work.loaded.fingerprint, "data_sha256": work.corpus.sha256},
                         engine_seconds=engine_seconds, wall_seconds=time.perf_counter() - started, shape=shape)


def compare_chunked(reference: WindowPass, tokens: torch.Tensor, scores: WindowScores, chunk: int) -> WindowComparison:
    """The engine's window against the reference's pass run chunk by chunk: each chunk's logits are
    compared with the engine's positions inside it, so the reference's ``[ctx, vocab]`` logits never exist."""
    reference.reset()
    parts = []
    for start, end in chunk_bounds(len(tokens), chunk):
        logits = reference.step(tokens[start:end])
        inside = ((scores.positions >= start) & (scores.positions < end)).nonzero()[:, 0]
        if inside.numel():
            part = compare_window(logits, tokens[start:], scores.rows(inside, shift=start))
            parts.append(WindowComparison(part.metrics, part.tail_mass, part.positions + start))
    if not parts:
        raise DataError("the engine scored no position of the window; use a longer --ctx")
    return WindowComparison(concat_metrics([p.metrics for p in parts]), np.concatenate([p.tail_mass for p in parts]),
                            np.concatenate([p.positions for p in parts]))


def engine_result(info: EngineInfo, parts: list[WindowComparison], windows: WindowSet, *, topk: int, model: str, data: str,
                  fingerprints: dict, engine_seconds: float, wall_seconds: float, shape: ModelShape | None,
                  reference: dict | None = None, bound_note: str | None = None) -> EngineEvalResult:
    """The result of one engine over all windows; ``topk`` > 0 means its KLD is the top-k lower bound."""
    arrays = arrays_from(parts, windows.documents if windows.documents is not None and len(windows.documents) == len(parts) else None)
    tail = np.concatenate([p.tail_mass for p in parts])
    spec = kv_spec_of(info)
    method = "full" if topk == 0 else "topk-bound"
    notes = [] if method == "full" else [
        f"KLD is a lower bound from {bound_note or f'top-{topk} log-probs (+ the scored token, + one rest bucket)'}; "
        f"the reference's mean mass outside the reported tokens is {tail.mean():.4f}"]
    kv_bytes = shape.kv_bytes_per_token(spec) if spec is not None and shape is not None else float("nan")
    return EngineEvalResult(
        model=model, data=data, ctx=windows.ctx, weights="engine",
        kv=f"{info.engine}:{info.kv}", weights_spec={}, kv_spec=spec.to_dict() if spec else {},
        weight_bytes=Path(info.details["gguf"]).stat().st_size if "gguf" in info.details else 0, kv_bytes_per_token=kv_bytes,
        seconds=engine_seconds, arrays=arrays, buckets=position_buckets(windows.ctx),
        fingerprints=fingerprints, notes=notes,
        engine={"name": info.engine, "version": info.version, **info.details, "wall_seconds": wall_seconds},
        kld_method=method, tail_mass=float(tail.mean()), reference=dict(reference or TRANSFORMERS_REFERENCE),
    )


def engine_workload(model: str, data: str, *, ctx: int, tokens: int, score: str, bos: bool = False) -> Workload:
    work = prepare(model, data, ctx=ctx, tokens=tokens, score=score)
    return with_bos_windows(work) if bos else work
