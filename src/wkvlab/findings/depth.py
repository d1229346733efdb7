"""The depth finding on identical tokens: does the cache cost more when the same tokens sit deeper?

The old depth table (:func:`wkvlab.eval.depth.depth_tables`) compared position buckets of long
windows: each bucket held *different* text, so depth and content were confounded (on synthetic
data with no depth effect and page-level difficulty its block bootstrap said "grows/shrinks" in
29–35% of runs instead of 5%). This finding scores the **same target tokens** of every document
after prefixes of increasing length, as the seed study's design does:

    document d:  … [ prefix of length L ][ target: T tokens ] …
                     └ the L tokens right before the target, L = T, 2T, 4T, …, the longest that fits

For each L, the window ``[BOS] + prefix + target`` is evaluated with the reference and each cache,
and only the target tokens are scored, so every length scores exactly the same tokens; the penalty
at L is the mean KLD over them (unquantized weights: KLD against the reference *is* the cache's
penalty). Documents are the resampling unit (paired across lengths: the same documents in every
resample), and the growth penalty(L) − penalty(shortest) is decided by the one rule
(:func:`wkvlab.stats.decide`): margin m = 10% of the penalty at the shortest prefix, all (cache,
length) tests one Holm family, *grows* / *shrinks* beyond ±m, *flat within ±m*, or *undecided*.
The relative growth penalty(L) / penalty(shortest) − 1 is printed with its own interval.

The text is ``code-long`` (:mod:`wkvlab.data.corpora`): the eight longest top-level modules of the
Python standard library the venv ships (25k–75k tokens each, one document each, no download).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats import Interval, resample
from wkvlab.stats.bootstrap import MIN_UNITS, Units
from wkvlab.stats.decision import DEFAULT_MARGIN, Effect, MarginRule, Verdict, decide

DEPTH_DATA = "code-long"
DEPTH_TARGET = 512
MIN_LENGTHS = 4
GROWTH_WORDS = ("grows", "shrinks", "flat within ±m")


def prefix_lengths(target: int, longest: int) -> tuple[int, ...]:
    """``target, 2·target, 4·target, …`` below ``longest``, then ``longest`` itself."""
    if longest < target:
        raise DataError(f"no prefix of {target} tokens fits (at most {longest}); lower the target or use a longer model context")
    lengths, length = [], target
    while length < longest:
        lengths.append(length)
        length *= 2
    return (*lengths, longest)


def identical_token_windows(documents: list, lengths: tuple[int, ...], target: int, bos_id: int | None) -> dict[int, "WindowSet"]:
    """One :class:`WindowSet` per prefix length; row d is document d's prefix of that length and
    the same ``target`` tokens (the tokens right after the longest prefix), and only those are scored."""
    import torch

    from wkvlab.data.windows import WindowSet

    top = max(lengths)
    short = [d.numel() for d in documents if d.numel() < top + target]
    if short:
        raise DataError(f"{len(short)} document(s) are shorter than the longest prefix plus the target ({top + target} tokens)")
    bos = [] if bos_id is None else [torch.tensor([bos_id], dtype=torch.long)]
    out = {}
    for length in lengths:
        rows = torch.stack([torch.cat([*bos, d[top - length : top + target]]) for d in documents])
        # position p predicts token p + 1: the first target token is predicted from the prefix's last position
        out[length] = WindowSet(tokens=rows, score_from=len(bos) + length - 1, bos=bos_id is not None)
    return out


@dataclass(frozen=True)
class DepthRow:
    """One cache at one prefix length: its penalty on the target tokens, and the growth from the shortest prefix."""

    kv: str
    length: int
    tokens: int
    penalty: Interval
    growth: Interval | None  # penalty(L) − penalty(shortest), paired by document (None at the shortest)
    relative: Interval | None  # penalty(L) / penalty(shortest) − 1
    verdict: Verdict | None = None

    def to_dict(self) -> dict:
        return {"kv": self.kv, "length": self.length, "tokens": self.tokens, "penalty": self.penalty.to_dict(),
                "growth": self.growth.to_dict() if self.growth else None, "relative": self.relative.to_dict() if self.relative else None,
                "verdict": self.verdict.word if self.verdict else None, "decision": self.verdict.to_dict() if self.verdict else None}


def depth_rows(results: Mapping[int, Mapping[str, "EvalResult"]], *, margin: float = DEFAULT_MARGIN) -> list[DepthRow]:
    """``results[length][kv]``: each cache's result on :func:`identical_token_windows` (same documents, same targets)."""
    lengths = sorted(results)
    if len(lengths) < MIN_LENGTHS:
        raise DataError(f"depth needs at least {MIN_LENGTHS} prefix lengths, got {len(lengths)}")
    first = lengths[0]
    rows, effects = [], []
    for kv in results[first]:
        cells = {length: results[length][kv] for length in lengths}
        units = cells[first].arrays.window  # one window per document: the same targets after each prefix
        doc_units = Units(units, "documents")
        for length, r in cells.items():
            if r.arrays.kld.shape != units.shape or not np.array_equal(r.arrays.window, units):
                raise DataError(f"{kv} at prefix {length} was not scored on the same documents and targets as at prefix {first}")
        arrays = {f"L{length}": r.arrays.kld for length, r in cells.items()}
        base = f"L{first}"
        for length in lengths:
            name = f"L{length}"
            penalty = resample(lambda m, n=name: m[n], arrays, doc_units).interval()
            growth = relative = None
            if length != first:
                draws = resample(lambda m, n=name: m[n] - m[base], arrays, doc_units)
                growth = draws.interval()
                relative = resample(lambda m, n=name: m[n] / m[base] - 1.0, arrays, doc_units).interval()
                effects.append((len(rows), Effect(f"{kv}: prefix {length} − prefix {first}", draws,
                                                  MarginRule.parse(margin).difference(float(cells[first].arrays.kld.mean()),
                                                                                      f"the penalty at prefix {first}", "nats"), int(units.size), GROWTH_WORDS)))
            rows.append(DepthRow(kv, length, int(units.size), penalty, growth, relative))
    verdicts = decide([e for _, e in effects], family="depth: every cache × prefix length against the shortest")
    from dataclasses import replace

    for (i, _), v in zip(effects, verdicts):
        rows[i] = replace(rows[i], verdict=v)
    return rows


@dataclass
class DepthFinding:
    model: str
    data: str
    documents: int
    target: int
    lengths: tuple[int, ...]
    rows: list[DepthRow]
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"design": "identical target tokens", "model": self.model, "data": self.data, "documents": self.documents,
                "target": self.target, "lengths": list(self.lengths), "rows": [r.to_dict() for r in self.rows],
                "seconds": self.seconds, "notes": self.notes}


def step_weights(counts: Mapping[int, int], tokens_per_step: Mapping[int, float]) -> dict[int, float]:
    """How much one progress step of each prefix length counts, so the ETA sees the longer windows' cost.

    The runner ticks once per chunk pass, and a whole 64-token window is one pass as an 8,192-token
    one is: counted alike, the short lengths (run first) made the ETA read minutes for an hour's run.
    A step weighs its tokens (still an underestimate where attention's quadratic share is large), scaled
    so the weighted steps add up to the plain count the progress line shows."""
    total = sum(counts[length] * tokens_per_step[length] for length in counts)
    scale = sum(counts.values()) / total if total else 1.0
    return {length: tokens_per_step[length] * scale for length in counts}


def measure_depth(model: str, kvs: tuple[str, ...], *, target: int = DEPTH_TARGET, longest: int | None = None, data: str = DEPTH_DATA,
                  documents: int = MIN_UNITS, progress=None, device: str = "auto", dtype: str = "auto", margin: float = DEFAULT_MARGIN) -> DepthFinding:
    """Score each document's same ``target`` tokens after prefixes of increasing length, up to
    ``longest`` (default: the model's context limit, or what the shortest document allows)."""
    import time
    from contextlib import nullcontext

    import torch

    from wkvlab.data import load_corpus, tokenize, tokenizer_wants_bos
    from wkvlab.eval.runner import run_grid
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import load_model, resolve_device, resolve_dtype
    from wkvlab.weights.spec import WeightSpec

    started = time.perf_counter()
    corpus = load_corpus(data)
    if not corpus.documents:
        raise DataError(f"{corpus.name} is one text, not separate documents; the depth finding needs documents (use {DEPTH_DATA})")
    if len(corpus.documents) < documents:
        raise DataError(f"{corpus.name} has {len(corpus.documents)} documents, fewer than the {documents} asked for")
    resolved = resolve_device(device)
    loaded = load_model(model, device=resolved, dtype=resolve_dtype(dtype, resolved))
    tok = loaded.tokenizer
    bos = tok.bos_token_id if tokenizer_wants_bos(tok) else None
    ids = [tokenize(tok, text) for text in corpus.documents[:documents]]
    room = min(loaded.max_context - (bos is not None), min(d.numel() for d in ids)) - target
    lengths = prefix_lengths(target, min(longest, room) if longest else room)
    if len(lengths) < MIN_LENGTHS:
        raise DataError(f"only {len(lengths)} prefix lengths fit ({', '.join(map(str, lengths))}); lower the target below {target} "
                        f"or use a model with a longer context")
    windows = identical_token_windows(ids, lengths, target, bos)
    specs = [KVSpec.parse(k) for k in kvs]
    fingerprints = {"model_sha256": loaded.fingerprint, "data_sha256": corpus.sha256}
    from wkvlab.eval.chunks import auto_chunk, chunk_bounds
    from wkvlab.eval.runner import grid_steps

    vocab = loaded.model.config.get_text_config().vocab_size
    chunks = {length: auto_chunk(vocab, w.ctx) for length, w in windows.items()}
    counts = {length: grid_steps(w, 1, len(specs), chunk=chunks[length]) for length, w in windows.items()}
    weights = step_weights(counts, {length: w.ctx / len(chunk_bounds(w.ctx, chunks[length])) for length, w in windows.items()})
    bar = progress(sum(counts.values()), f"depth: {len(specs)} caches × {len(lengths)} prefix lengths × {len(ids)} documents") \
        if progress is not None else nullcontext(lambda _d, _n: None)
    results = {}
    with bar as tick, torch.no_grad():
        for length, win in windows.items():
            weighted = lambda desc, n, w=weights[length]: tick(desc, n * w)  # noqa: E731
            grid = run_grid(loaded.model, win, [WeightSpec()], specs, model_name=loaded.name, data_name=f"{corpus.name}@prefix{length}",
                            fingerprints=fingerprints, progress=weighted)
            results[length] = {r.kv: r for r in grid}
    rows = depth_rows(results, margin=margin)
    return DepthFinding(loaded.name, corpus.name, len(ids), target, lengths, rows, time.perf_counter() - started)


__all__ = ["DepthFinding", "DepthRow", "depth_rows", "identical_token_windows", "measure_depth", "prefix_lengths", "step_weights"]
