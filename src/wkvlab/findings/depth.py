"""The depth finding on identical tokens: does the cache cost more when the same tokens sit deeper?

The old depth table (:func:`wkvlab.eval.depth.depth_tables`) compared position buckets of long
windows: each bucket held *different* text, so depth and content were confounded (on synthetic
data with no depth effect and page-level difficulty its block bootstrap said "grows/shrinks" in
29–35% of runs instead of 5%). This finding scores the **same target tokens** of every document
after prefixes of increasing length, as the seed study's design does:

    document d:  … [ prefix of length L ][ target: T tokens ] …
                     └ the L tokens right before the target, L = S, 2S, 4S, …, the longest

For each L, the window ``[BOS] + prefix + target`` is evaluated with the reference and each cache,
and only the target tokens are scored, so every length scores exactly the same tokens; the penalty
at L is the mean KLD over them (unquantized weights: KLD against the reference *is* the cache's
penalty). Documents are the resampling unit (paired across lengths).

**Enough documents** (issue #38): at 8 documents a true +15% growth was decided 0.3% of the time.
The text is the whole standard library (``code``: one document per top-level module), and the
longest prefix is the longest that at least ``documents`` (32) modules reach with their targets —
there are many more modules past 8k tokens than past 23k — within the model's limit, and the first
``documents`` of the modules that reach it (in the text's order) are used. :func:`reach` counts the
modules that hold each prefix, and the finding records it. The eight longest
modules (``code-long``) to the model's limit are a separate run (``wkvlab findings depth-long``),
reported on its own: too few documents to decide anything but a very large change
(:mod:`wkvlab.findings.depth_power` prints its power next to the main run's).

**The reference sharpens with a longer prefix**: it predicts the targets better, and a sharper
distribution can show a lower KLD for the same cache damage. The control: the reference's own mean
NLL on the targets at each length (how much it sharpens), and the **sharpening-adjusted growth**
``KLD(L) · NLL_ref(S) / NLL_ref(L) − KLD(S)``: the penalty at L per nat of the reference's NLL,
brought to the shortest prefix's scale. (The reference NLL on the actual next token is the per-token
measure of the reference's uncertainty the stored results keep; its mean is the cross-entropy.)

**Decided**, by the one rule (:func:`wkvlab.stats.decide`): at the **longest prefix**, for every
cache, the growth KLD(L) − KLD(S) and the sharpening-adjusted growth, one Holm family (a pre-declared
primary contrast: the intermediate lengths are printed with intervals, not decided, so the family
stays small enough for the design's power). Margin m: a share of the penalty at the shortest prefix
(estimated on the same documents, its uncertainty inside the test), **5%** unless ``--margin`` says
otherwise — the margin at which the design has ≥ 80% power for a +15% growth
(:mod:`wkvlab.findings.depth_power`); *grows* / *shrinks* beyond ±m, *flat within ±m*, or
*undecided*.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats import Interval
from wkvlab.stats.bootstrap import MIN_UNITS, per_unit, resample_sums
from wkvlab.stats.decision import MarginRule, Verdict, decide

DEPTH_DATA = "code"
LONG_DATA = "code-long"
DEPTH_TARGET = 2048
DEPTH_SHORTEST = 512
DEPTH_DOCUMENTS = 32  # at least this many documents reach the longest prefix (issue #38)
LONG_DOCUMENTS = 8  # code-long has exactly eight
CACHE_VERSION = 2  # of a part's cached scores (length_key): bump when what they measure changes (2: parts of documents)
# A prefix length is measured and cached in parts of this many documents: at SmolLM2's longest prefix one length is
# 32 windows of 8,191 tokens × 4 passes, over an hour on two CPU cores, and a run stopped inside it (its machine's life
# ended) lost the whole length; a part is ~9 minutes there. Windows are scored one by one, so a part's numbers are the
# ones the whole length's run gives its documents.
DOCUMENTS_PER_PART = 4
DEPTH_MARGIN = "5%"  # of the penalty at the shortest prefix: see the module docstring and depth_power
MIN_LENGTHS = 4
GROWTH_WORDS = ("grows", "shrinks", "flat within ±m")
FAMILY = "depth: growth at the longest prefix, raw and sharpening-adjusted, every cache"


def prefix_lengths(shortest: int, longest: int) -> tuple[int, ...]:
    """``shortest, 2·shortest, 4·shortest, …`` below ``longest``, then ``longest`` itself."""
    if longest < shortest:
        raise DataError(f"no prefix of {shortest} tokens fits (at most {longest}); lower the target or use a longer model context")
    lengths, length = [], shortest
    while length < longest:
        lengths.append(length)
        length *= 2
    return (*lengths, longest)


REACH_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def reach(document_tokens: list[int], target: int, lengths=REACH_LENGTHS) -> dict[int, int]:
    """How many documents hold each prefix length plus ``target`` tokens (what the finding records, with the longest
    prefix it measured: the documents a larger run of it could use)."""
    return {length: sum(n >= length + target for n in document_tokens) for length in lengths}


def longest_reached(document_tokens: list[int], target: int, documents: int, limit: int) -> int:
    """The longest prefix that at least ``documents`` documents reach with their ``target`` tokens, within ``limit``
    tokens of window (prefix + target)."""
    if len(document_tokens) < documents:
        raise DataError(f"the text has {len(document_tokens)} documents, fewer than the {documents} the depth design needs")
    kth = sorted(document_tokens, reverse=True)[documents - 1]
    return min(kth, limit) - target


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


def _optional(interval: Interval | None):
    return interval.to_dict() if interval else None


@dataclass(frozen=True)
class DepthRow:
    """One cache at one prefix length: its penalty on the target tokens, the growth from the shortest prefix, raw and
    adjusted for the reference's sharpening; verdicts at the longest prefix only (the decided contrast)."""

    kv: str
    length: int
    tokens: int
    penalty: Interval
    growth: Interval | None  # penalty(L) − penalty(shortest), paired by document (None at the shortest)
    relative: Interval | None  # penalty(L) / penalty(shortest) − 1
    verdict: Verdict | None = None  # on growth, at the longest prefix
    adjusted: Interval | None = None  # penalty(L) · NLL_ref(S) / NLL_ref(L) − penalty(S)
    adjusted_verdict: Verdict | None = None
    reference: Interval | None = None  # the reference's mean NLL on the targets at this length
    sharpening: Interval | None = None  # NLL_ref(L) / NLL_ref(S) − 1

    def to_dict(self) -> dict:
        return {"kv": self.kv, "length": self.length, "tokens": self.tokens, "penalty": self.penalty.to_dict(),
                "growth": _optional(self.growth), "relative": _optional(self.relative),
                "verdict": self.verdict.word if self.verdict else None, "decision": self.verdict.to_dict() if self.verdict else None,
                "adjusted": _optional(self.adjusted), "adjusted_decision": self.adjusted_verdict.to_dict() if self.adjusted_verdict else None,
                "reference": _optional(self.reference), "sharpening": _optional(self.sharpening)}


@dataclass(frozen=True)
class LengthScores:
    """One prefix length measured, per document (sorted labels): the scored target tokens, the reference's NLL summed
    over them and each cache's KLD summed over them — all the finding reads (:func:`wkvlab.stats.resample_sums`), a
    few hundred bytes per length where the per-token results are megabytes (a run is carried between machines)."""

    counts: np.ndarray  # tokens per document
    nll_ref: np.ndarray  # sum per document
    kld: Mapping[str, np.ndarray]  # cache label -> sum per document

    @classmethod
    def from_results(cls, results: Mapping[str, "EvalResult"]) -> "LengthScores":
        """From each cache's result on one length's windows (one window per document: its units)."""
        first = next(iter(results.values()))
        units = first.arrays.window
        counts, sums = per_unit({"nll": first.arrays.nll_ref, **{f"kld {kv}": r.arrays.kld for kv, r in results.items()}}, units)
        return cls(counts, sums["nll"], {kv: sums[f"kld {kv}"] for kv in results})

    @classmethod
    def joined(cls, parts: list["LengthScores"]) -> "LengthScores":
        """One length's scores from its parts' (documents in the parts' order)."""
        kvs = list(parts[0].kld)
        return cls(np.concatenate([p.counts for p in parts]), np.concatenate([p.nll_ref for p in parts]),
                   {kv: np.concatenate([p.kld[kv] for p in parts]) for kv in kvs})

    def means(self, name: str | None = None) -> list[float]:
        """Per-document mean KLD of cache ``name`` (None: the reference's NLL)."""
        return (np.asarray(self.nll_ref if name is None else self.kld[name]) / self.counts).tolist()


def depth_table(scores: Mapping[int, LengthScores], *, margin="5%", tokens: int | None = None) -> list[DepthRow]:
    """The rows from the same documents' target tokens after each prefix length (``scores[length]``): decides the
    longest prefix against the shortest, raw and adjusted for the reference's sharpening, one family. ``tokens``: the
    scored tokens the rows name, where ``counts`` are not tokens (a simulation of per-document means)."""
    rule = MarginRule.parse(margin)
    lengths = sorted(scores)
    first, last = lengths[0], lengths[-1]
    counts = scores[first].counts
    for length in lengths:
        if not np.array_equal(scores[length].counts, counts) or set(scores[length].kld) != set(scores[first].kld):
            raise DataError(f"prefix {length} was not scored on the same documents, targets and caches as prefix {first}")
    n_tokens = int(counts.sum()) if tokens is None else tokens
    ref = {f"N{length}": scores[length].nll_ref for length in lengths}

    def sampled(statistic, sums):
        return resample_sums(statistic, counts, sums, "documents")

    reference = {length: sampled(lambda m, n=f"N{length}": m[n], ref).interval() for length in lengths}
    sharpening = {length: sampled(lambda m, n=f"N{length}": m[n] / m[f"N{first}"] - 1.0, ref).interval() for length in lengths[1:]}
    rows, effects = [], []
    for kv in scores[first].kld:
        sums = {**ref, **{f"K{length}": scores[length].kld[kv] for length in lengths}}
        base, nbase = f"K{first}", f"N{first}"
        baseline = sampled(lambda m: m[base], sums)
        for length in lengths:
            k, n = f"K{length}", f"N{length}"
            row = DepthRow(kv, length, n_tokens, baseline.interval() if length == first else sampled(lambda m: m[k], sums).interval(),
                           None, None, reference=reference[length], sharpening=sharpening.get(length))
            if length != first:
                growth = sampled(lambda m: m[k] - m[base], sums)
                adjusted = sampled(lambda m: m[k] * m[nbase] / m[n] - m[base], sums)
                relative = sampled(lambda m: m[k] / m[base] - 1.0, sums).interval()
                row = replace(row, growth=growth.interval(), relative=relative, adjusted=adjusted.interval())
                if length == last:
                    of = f"the penalty at prefix {first}"
                    effects.append((len(rows), "verdict", rule.difference_effect(f"{kv}: prefix {length} − prefix {first}", growth, baseline,
                                                                                 of, n_tokens, unit="nats", words=GROWTH_WORDS)))
                    effects.append((len(rows), "adjusted_verdict", rule.difference_effect(
                        f"{kv}: prefix {length} − prefix {first}, adjusted for the reference's sharpening", adjusted, baseline, of, n_tokens,
                        unit="nats", words=GROWTH_WORDS)))
            rows.append(row)
    verdicts = decide([e for *_, e in effects], family=FAMILY)
    for (i, name, _), v in zip(effects, verdicts):
        rows[i] = replace(rows[i], **{name: v})
    return rows


def depth_rows(results: Mapping[int, Mapping[str, "EvalResult"]], *, margin=DEPTH_MARGIN) -> list[DepthRow]:
    """``results[length][kv]``: each cache's result on :func:`identical_token_windows` (same documents, same targets)."""
    lengths = sorted(results)
    if len(lengths) < MIN_LENGTHS:
        raise DataError(f"depth needs at least {MIN_LENGTHS} prefix lengths, got {len(lengths)}")
    first = lengths[0]
    units = next(iter(results[first].values())).arrays.window  # one window per document: the same targets after each prefix
    for length in lengths:
        for kv, r in results[length].items():
            if r.arrays.kld.shape != units.shape or not np.array_equal(r.arrays.window, units):
                raise DataError(f"{kv} at prefix {length} was not scored on the same documents and targets as at prefix {first}")
    return depth_table({length: LengthScores.from_results(results[length]) for length in lengths}, margin=margin)


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
    reach: dict = field(default_factory=dict)  # prefix length -> documents long enough for it and the targets
    minimum: int = 0  # the documents the design asks to reach the longest prefix
    names: list = field(default_factory=list)  # the documents used
    per_document: dict = field(default_factory=dict)  # kv -> length -> mean KLD per document; "reference NLL" likewise
    read_back: list = field(default_factory=list)  # (prefix length, first document) of the parts an earlier run measured

    def to_dict(self) -> dict:
        return {"design": "identical target tokens", "model": self.model, "data": self.data, "documents": self.documents,
                "target": self.target, "lengths": list(self.lengths), "rows": [r.to_dict() for r in self.rows],
                "seconds": self.seconds, "notes": self.notes, "reach": {str(k): v for k, v in self.reach.items()},
                "minimum_documents": self.minimum, "document_names": self.names, "per_document": self.per_document,
                "read_back": [list(part) for part in self.read_back], "documents_per_part": DOCUMENTS_PER_PART,
                "parts": len(self.lengths) * -(-self.documents // DOCUMENTS_PER_PART)}


def step_weights(counts: Mapping[int, int], tokens_per_step: Mapping[int, float]) -> dict[int, float]:
    """How much one progress step of each prefix length counts, so the ETA sees the longer windows' cost.

    The runner ticks once per chunk pass, and a whole 64-token window is one pass as an 8,192-token
    one is: counted alike, the short lengths (run first) made the ETA read minutes for an hour's run.
    A step weighs its tokens (still an underestimate where attention's quadratic share is large), scaled
    so the weighted steps add up to the plain count the progress line shows."""
    total = sum(counts[length] * tokens_per_step[length] for length in counts)
    scale = sum(counts.values()) / total if total else 1.0
    return {length: tokens_per_step[length] * scale for length in counts}


def parts_of(windows) -> list[tuple[int, "WindowSet"]]:
    """One length's windows cut into parts of :data:`DOCUMENTS_PER_PART` documents: (first document, its windows)."""
    return [(first, replace(windows, tokens=windows.tokens[first : first + DOCUMENTS_PER_PART]))
            for first in range(0, windows.n_windows, DOCUMENTS_PER_PART)]


def length_key(fingerprints: dict, windows, kvs, *, length: int, target: int) -> str:
    """Content address of one part of a prefix length's measurement: what its numbers depend on — the model, its dtype
    and device kind, the exact tokens of the part's windows (documents, prefix, targets, BOS) and the caches, in order.
    Scores cached under it are that measurement, whichever run (or machine) wrote them."""
    import hashlib
    import json

    from wkvlab.weights.spec import WeightSpec

    payload = {"finding": "depth", "version": CACHE_VERSION, **fingerprints, "length": length, "target": target,
               "windows_sha256": hashlib.sha256(windows.tokens.numpy().tobytes()).hexdigest(),
               "weights": WeightSpec().to_dict(), "kv": [kv.to_dict() for kv in kvs]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _cache_path(key: str):
    from wkvlab.models.loading import cache_dir

    return cache_dir() / "findings-depth" / f"{key}.npz"


def cached_length(key: str, labels: list[str]) -> LengthScores | None:
    path = _cache_path(key)
    if not path.is_file():
        return None
    data = np.load(path)
    return LengthScores(data["counts"], data["nll_ref"], {kv: data[f"kld{i}"] for i, kv in enumerate(labels)})


def save_length(key: str, scores: LengthScores) -> None:
    path = _cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, counts=scores.counts, nll_ref=scores.nll_ref, **{f"kld{i}": v for i, v in enumerate(scores.kld.values())})
    tmp.replace(path)  # a killed run never leaves half a file under the real name


def measure_depth(model: str, kvs: tuple[str, ...], *, target: int = DEPTH_TARGET, longest: int | None = None, data: str = DEPTH_DATA,
                  documents: int = DEPTH_DOCUMENTS, shortest: int | None = None, progress=None, device: str = "auto", dtype: str = "auto",
                  margin=DEPTH_MARGIN) -> DepthFinding:
    """Score the same ``target`` tokens of every document long enough after prefixes of increasing length, from
    ``shortest`` (default: 512, or the target if smaller) to the longest that at least ``documents`` documents reach
    within the model's limit (or ``longest``).

    Each prefix length is measured in parts of :data:`DOCUMENTS_PER_PART` documents; a part's per-document scores go
    into the on-disk cache (``findings-depth/``, content-addressed by :func:`length_key`) as soon as it is done, and a
    part already there is read back instead of measured, so an interrupted run (hours at 8k tokens on a CPU) resumes at
    the part it was on — on another machine too, when the
    files are carried there (scripts/findings_carry.py)."""
    import time
    from contextlib import ExitStack, nullcontext

    import torch

    from wkvlab.data import load_corpus, tokenize, tokenizer_wants_bos
    from wkvlab.eval.runner import run_grid
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import load_model, resolve_device, resolve_dtype
    from wkvlab.search.api import numerics
    from wkvlab.weights.spec import WeightSpec

    if documents < MIN_UNITS:
        raise DataError(f"the depth finding needs at least {MIN_UNITS} documents (the rule's minimum), got {documents}")
    started = time.perf_counter()
    corpus = load_corpus(data)
    if not corpus.documents:
        raise DataError(f"{corpus.name} is one text, not separate documents; the depth finding needs documents (use {DEPTH_DATA})")
    if len(corpus.documents) < documents:
        raise DataError(f"{corpus.name} has {len(corpus.documents)} documents, fewer than the {documents} the depth design needs")
    resolved = resolve_device(device)
    loaded = load_model(model, device=resolved, dtype=resolve_dtype(dtype, resolved))
    tok = loaded.tokenizer
    bos = tok.bos_token_id if tokenizer_wants_bos(tok) else None
    ids = [tokenize(tok, text) for text in corpus.documents]
    sizes = [d.numel() for d in ids]
    limit = loaded.max_context - (bos is not None)
    if longest:
        limit = min(limit, longest + target)
    top = longest_reached(sizes, target, documents, limit)
    lengths = prefix_lengths(shortest or min(target, DEPTH_SHORTEST), top)
    if len(lengths) < MIN_LENGTHS:
        raise DataError(f"only {len(lengths)} prefix lengths fit ({', '.join(map(str, lengths))}) in the {documents} longest documents of "
                        f"{corpus.name} and the model's {loaded.max_context:,} tokens; lower the target below {target}")
    # the first `documents` (in the text's order) of those that reach the longest prefix: the size the power is shown at
    chosen = [i for i, n in enumerate(sizes) if n >= top + target][:documents]
    windows = identical_token_windows([ids[i] for i in chosen], lengths, target, bos)
    specs = [KVSpec.parse(k) for k in kvs]
    fingerprints = {"model_sha256": loaded.fingerprint, "data_sha256": corpus.sha256}
    from wkvlab.eval.chunks import auto_chunk, chunk_bounds
    from wkvlab.eval.runner import grid_steps

    vocab = loaded.model.config.get_text_config().vocab_size
    chunks = {length: auto_chunk(vocab, w.ctx) for length, w in windows.items()}
    part_steps = lambda part, length: grid_steps(part, 1, len(specs), chunk=chunks[length])  # noqa: E731
    counts = {length: sum(part_steps(part, length) for _, part in parts_of(w)) for length, w in windows.items()}
    weights = step_weights(counts, {length: w.ctx / len(chunk_bounds(w.ctx, chunks[length])) for length, w in windows.items()})
    bar = progress(sum(counts.values()), f"depth: {len(specs)} caches × {len(lengths)} prefix lengths × {len(chosen)} documents") \
        if progress is not None else nullcontext(lambda _d, _n: None)
    scores, read_back = {}, []
    labels = [kv.label for kv in specs]
    with ExitStack() as stack, torch.no_grad():
        tick = stack.enter_context(bar)
        for length, win in windows.items():
            parts = []
            for first, part in parts_of(win):
                name = f"prefix {length}, documents {first + 1}–{first + part.n_windows}"
                key = length_key({**fingerprints, **numerics(loaded)}, part, specs, length=length, target=target)
                cached = cached_length(key, labels)
                if cached is not None:
                    parts.append(cached)
                    read_back.append((length, first))
                    tick(f"{name}: read back from the cache", part_steps(part, length) * weights[length])
                    continue
                weighted = lambda desc, n, w=weights[length]: tick(desc, n * w)  # noqa: E731
                grid = run_grid(loaded.model, part, [WeightSpec()], specs, model_name=loaded.name,
                                data_name=f"{corpus.name}@prefix{length}[{first}:{first + part.n_windows}]",
                                fingerprints=fingerprints, progress=weighted)
                units = grid[0].arrays.window  # one window per document
                if any(not np.array_equal(r.arrays.window, units) for r in grid):
                    raise DataError(f"{name}: the caches were not scored on the same documents")
                parts.append(LengthScores.from_results({label: r for label, r in zip(labels, grid)}))  # grid order: the specs'
                save_length(key, parts[-1])
            scores[length] = LengthScores.joined(parts)
    rows = depth_table(scores, margin=margin)
    values = {kv: {str(length): scores[length].means(kv) for length in lengths} for kv in labels}
    values["reference NLL"] = {str(length): scores[length].means() for length in lengths}
    names = [corpus.documents[i].split("\n", 1)[0].removeprefix("# file: ") for i in chosen]
    return DepthFinding(loaded.name, corpus.name, len(chosen), target, lengths, rows, time.perf_counter() - started,
                        reach=reach(sizes, target, lengths=tuple(sorted({*REACH_LENGTHS, lengths[-1]}))), minimum=documents,
                        names=names, per_document=values, read_back=read_back)


__all__ = ["DepthFinding", "DepthRow", "LengthScores", "depth_rows", "depth_table", "identical_token_windows", "length_key", "longest_reached",
           "measure_depth", "prefix_lengths", "reach", "step_weights"]
