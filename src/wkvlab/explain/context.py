"""KLD and top-1 by query position on long documents: a position table, described and not decided.

KV-cache error accumulates with context (every query reads all earlier quantized keys, and a
softmax over more keys spreads a fixed score error over more mass), weight error does not in the
same way. So the position curve is reported per cell of the factorial and, the quantity the issue
asks for, as the difference from the 16-bit cache under the same weights:
``KLD(W+C) − KLD(W)`` per bucket (and ``KLD(C)`` itself for unquantized weights).

Documents: consecutive windows of ``max_ctx`` tokens of the corpus, which is one long
concatenation of its pages/files (deterministic for a Python version, see data/corpora.py). When
the corpus is too short for the documents asked for, the other embedded corpora are appended, in
a fixed order, rather than repeating text (repeats would be easy to predict from the cache and flatter
a quantized cache at long range).

Intervals: each long window (a "document" here, cut from the stream) is the interval's unit
(:attr:`wkvlab.eval.TokenArrays.units`, which says so in every verdict). A bucket mean is a ratio of two token-weighted means
(masked sum / masked count), so every per-bucket statistic and the growth between two buckets is a
function of whole-set means and goes through the same :func:`paired_interval`.

**No verdict.** The last bucket and the first hold different text (the tail of each document and
its opening), so their difference mixes position with content, and no margin or family could make
it a statement about context: the change is printed as an interval and says so, as
:mod:`wkvlab.eval.depth` does. ``wkvlab findings depth`` decides depth on identical tokens (issue
#38 item 7: the "grows with context" this printed came from such buckets).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from wkvlab.data import Corpus, WindowSet, load_corpus, make_windows, tokenize, tokenizer_wants_bos
from wkvlab.errors import ConfigError, DataError
from wkvlab.eval.result import EvalResult
from wkvlab.stats import Interval, paired_interval
from wkvlab.stats.decision import Verdict

CONFOUNDED = ("a position table, not a context verdict: the buckets hold different text (position mixed with content); "
              "wkvlab findings depth scores identical tokens")

POSITION_EDGES = (0, 4, 64, 256, 1024, 2048, 4096, 8192)
SINKS = 4  # positions 0..3: attention sinks, reported apart so they do not hide the growth


def context_buckets(max_ctx: int, edges: tuple[int, ...] = POSITION_EDGES) -> list[tuple[int, int]]:
    """Query-position buckets up to ``max_ctx - 1`` (the last position predicts nothing)."""
    last = max_ctx - 1
    cuts = sorted({min(e, last) for e in edges} | {last})
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def long_token_stream(corpus: Corpus, tokenizer, needed: int) -> torch.Tensor:
    """The corpus's tokens, followed by the other embedded corpora's when it has fewer than ``needed``."""
    ids = [tokenize(tokenizer, corpus.text)]
    for other in ("prose", "code"):  # code-long repeats modules that code already holds
        if sum(t.numel() for t in ids) >= needed:
            break
        if other != corpus.name:
            ids.append(tokenize(tokenizer, "\n\n" + load_corpus(other).text))
    stream = torch.cat(ids)
    if stream.numel() < needed:
        raise DataError(f"the texts hold {stream.numel()} tokens, fewer than the {needed} the long documents need; lower --max-ctx or --context-docs")
    return stream


def long_windows(corpus: Corpus, tokenizer, max_ctx: int, documents: int, model_max: int) -> WindowSet:
    """``documents`` windows of ``max_ctx`` tokens each, built deterministically from the corpus."""
    if max_ctx > model_max:
        raise ConfigError(f"--max-ctx {max_ctx} is longer than the model's maximum context {model_max}; use --max-ctx {model_max} or less")
    if max_ctx < 2 * SINKS + 2:
        raise ConfigError(f"--max-ctx {max_ctx} is too short to show a position effect; use --max-ctx 256 or more")
    if documents < 1:
        raise ConfigError("--context-docs must be at least 1")
    bos = tokenizer.bos_token_id if tokenizer_wants_bos(tokenizer) else None
    stream = long_token_stream(corpus, tokenizer, documents * max_ctx)
    return make_windows(stream, ctx=max_ctx, n_tokens=documents * max_ctx, bos_id=bos)


def _bucket_mean(name: str, start: int):
    """Statistic: the mean of array ``name`` over the bucket starting at ``start`` (masked sum / masked count)."""
    return lambda m: m[f"{name}@{start}"] / m[f"n@{start}"]


@dataclass(frozen=True)
class BucketRow:
    start: int
    end: int
    tokens: int
    kld: dict  # cell ("w", "c", "wc") -> Interval of the mean KLD in this bucket
    top1: dict  # cell -> Interval of top-1 agreement in this bucket
    kv_excess: Interval  # KLD(W+C) − KLD(W): what the quantized cache adds under quantized weights
    kv_top1: Interval  # agreement(W+C) − agreement(W)

    def to_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "tokens": self.tokens,
                "kld": {k: v.to_dict() for k, v in self.kld.items()}, "top1": {k: v.to_dict() for k, v in self.top1.items()},
                "kv_excess": self.kv_excess.to_dict(), "kv_top1": self.kv_top1.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> "BucketRow":
        return cls(d["start"], d["end"], d["tokens"], {k: Interval.from_dict(v) for k, v in d["kld"].items()},
                   {k: Interval.from_dict(v) for k, v in d["top1"].items()}, Interval.from_dict(d["kv_excess"]), Interval.from_dict(d["kv_top1"]))


@dataclass(frozen=True)
class ContextCurve:
    """KLD and top-1 by position for the factorial cells, on ``documents`` long windows."""

    model: str
    data: str
    weights: str
    kv: str
    max_ctx: int
    documents: int
    rows: tuple[BucketRow, ...]
    growth_c: Interval  # KLD(C) in the last bucket minus in the first bucket after the sinks
    growth_wc: Interval  # the same for KLD(W+C) − KLD(W)
    verdict: Verdict | None = None  # records made before issue #38 item 7 decided growth_wc; it is no longer decided

    def to_dict(self) -> dict:
        return {"model": self.model, "data": self.data, "weights": self.weights, "kv": self.kv, "max_ctx": self.max_ctx,
                "documents": self.documents, "rows": [r.to_dict() for r in self.rows],
                "growth_c": self.growth_c.to_dict(), "growth_wc": self.growth_wc.to_dict(),
                "verdict": self.verdict.to_dict() if self.verdict else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ContextCurve":
        return cls(d["model"], d["data"], d["weights"], d["kv"], d["max_ctx"], d["documents"],
                   tuple(BucketRow.from_dict(r) for r in d["rows"]), Interval.from_dict(d["growth_c"]), Interval.from_dict(d["growth_wc"]),
                   Verdict.from_dict(d["verdict"]) if d.get("verdict") else None)

    def lines(self) -> list[str]:
        if len(self.rows) < 2:
            return []
        first = next((r for r in self.rows if r.start >= SINKS), self.rows[0])
        last = self.rows[-1]
        return [
            f"cache excess KLD(W+C) − KLD(W) at positions {first.start}-{first.end - 1}: {first.kv_excess.estimate:.4f}, "
            f"at {last.start}-{last.end - 1}: {last.kv_excess.estimate:.4f}; last minus first {self.growth_wc:.4f} "
            f"({self.growth_wc.level:.0%}, {self.growth_wc.n_units} {self.growth_wc.unit} of {self.max_ctx} tokens); {CONFOUNDED}",
        ]


def context_curve(cells: Mapping[str, EvalResult], *, buckets: list[tuple[int, int]] | None = None) -> ContextCurve:
    """Position curve of the factorial cells (``ref``, ``w``, ``c``, ``wc``) scored on the same windows."""
    from wkvlab.explain.compare import check_same_tokens

    ref = cells["ref"]
    for name in ("w", "c", "wc"):
        check_same_tokens(ref, cells[name])
    positions, units = ref.arrays.position, ref.arrays.units  # the long windows are one stream: windows (said in the verdict)
    buckets = [b for b in (buckets or context_buckets(ref.ctx)) if ((positions >= b[0]) & (positions < b[1])).any()]
    if not buckets:
        raise DataError("no scored positions fall in the position buckets; score all positions (--score all)")
    arrays: dict[str, np.ndarray] = {}
    for start, end in buckets:
        mask = ((positions >= start) & (positions < end)).astype(np.float64)
        arrays[f"n@{start}"] = mask
        for name in ("w", "c", "wc"):
            arrays[f"kld_{name}@{start}"] = cells[name].arrays.kld * mask
            arrays[f"agree_{name}@{start}"] = cells[name].arrays.top1_agree * mask

    def interval(statistic) -> Interval:
        return paired_interval(statistic, arrays, units)

    def excess(start: int, kind: str = "kld"):
        return lambda m: _bucket_mean(f"{kind}_wc", start)(m) - _bucket_mean(f"{kind}_w", start)(m)

    rows = []
    for start, end in buckets:
        rows.append(BucketRow(
            start, end, int(arrays[f"n@{start}"].sum()),
            kld={name: interval(_bucket_mean(f"kld_{name}", start)) for name in ("w", "c", "wc")},
            top1={name: interval(_bucket_mean(f"agree_{name}", start)) for name in ("w", "c", "wc")},
            kv_excess=interval(excess(start)),
            kv_top1=interval(excess(start, "agree")),
        ))
    first = next((b for b in buckets if b[0] >= SINKS), buckets[0])[0]
    last = buckets[-1][0]
    kld_c = lambda s: _bucket_mean("kld_c", s)  # noqa: E731
    return ContextCurve(
        model=ref.model, data=ref.data, weights=cells["wc"].weights, kv=cells["wc"].kv, max_ctx=ref.ctx,
        documents=int(np.unique(units.labels).size), rows=tuple(rows),
        growth_c=interval(lambda m: kld_c(last)(m) - kld_c(first)(m)),
        growth_wc=interval(lambda m: excess(last)(m) - excess(first)(m)),
    )
