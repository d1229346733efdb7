"""Stored results → the tidy tables the report draws: configs, KV penalties, cross-terms, position curves.

Everything here is a pure function of EvalResults (no I/O, no plotting), so the numbers in the HTML,
the PNGs and the Markdown/CSV tables are the same numbers, computed once.

Results are compared only inside a *group*: the same model file, text, window length and token count
(fingerprints included), because paired statistics need the same tokens. A store may hold several
groups (two models, two contexts); the report draws each on its own. A replicate (the grid measured
again by ``findings --replicates``: another calibration sample, another chunk size) is a group of its
own whose heading says so: pairing replicate 1 of one config with the measurement of another would
mix two runs in one difference, and one config must not appear twice in one table.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np

from wkvlab.errors import ConfigError, DataError, WkvlabError
from wkvlab.eval.result import EvalResult
from wkvlab.kv.spec import KVSpec
from wkvlab.stats.bootstrap import Interval, paired_interval, resample
from wkvlab.stats.replicates import replicate_label
from wkvlab.stats.decision import MarginRule, Verdict, decide

# Weight methods that leave the linear weights at 16 bits or more: 'none' is the checkpoint itself,
# 'cast' rounds it to bf16/fp16. 'none' is preferred as the baseline because its KLD is zero.
SIXTEEN_BIT_WEIGHT_METHODS = ("none", "cast")
KV_BIT_CLASSES = (16, 8, 4, 2)  # marker classes; a config's class is the nearest one from above
NOMINAL_HEAD_DIM = 128  # only when a result's head_dim is unknown (see head_dim_of)


def memory_bytes(weight_bytes: float, kv_bytes_per_token: float, context: int, batch: int = 1) -> float:
    """What serving one config occupies: the weights once, plus the KV cache of ``batch`` sequences of
    ``context`` tokens (the planner's ``kv_cache_bytes`` without engine block rounding)."""
    if context < 0 or batch < 1:
        raise ConfigError(f"--context must be >= 0 and --batch >= 1, got {context} and {batch}")
    return float(weight_bytes) + float(kv_bytes_per_token) * context * batch


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better on both), by x.

    A point is dropped when another has x <= and y <= with one strictly smaller; of identical
    points the first is kept, so the front has no duplicates.
    """
    order = sorted(range(len(xs)), key=lambda i: (xs[i], ys[i], i))
    front: list[int] = []
    best_y = float("inf")
    for i in order:
        if ys[i] < best_y:
            front.append(i)
            best_y = ys[i]
    return front


@functools.lru_cache(maxsize=None)
def _model_head_dim(model: str) -> int | None:
    from wkvlab.models.facts import model_facts

    try:
        facts = model_facts(model)
    except WkvlabError:
        return None
    return facts.head_dim if facts else None


def head_dim_of(result: EvalResult) -> int:
    """The head_dim a result's model has: recorded with the result (``model_shape``), else read from the
    model's files when its name still resolves (stores written before the shape was recorded), else 128."""
    shape = getattr(result, "model_shape", None) or {}
    return int(shape.get("head_dim") or _model_head_dim(result.model) or NOMINAL_HEAD_DIM)


def kv_bits(kv_spec: dict, head_dim: int = NOMINAL_HEAD_DIM) -> float:
    """Average stored bits per K/V element of a config's main formats (16 for model precision), scale
    and zero-point bytes included: they are per group or per head vector, so they depend on head_dim
    (int4 is 4.5 bits at head_dim 64, 4.25 at 128)."""
    spec = KVSpec.from_dict(kv_spec)
    if spec.is_identity:
        return 16.0
    per_format = [f.bytes_per_vector(head_dim) * 8 / head_dim for f in (spec.k_format, spec.v_format)]
    return float(np.mean(per_format))


def kv_bit_class(bits: float) -> int:
    """The marker class of a cache: [0, 3) bits → 2, [3, 6) → 4, [6, 12) → 8, 12 and up → 16.

    The bounds sit halfway between classes on a log scale, so scale overheads (q8_0's 8.5 bits,
    int4's 4.5) and K/V mixes lean to the nearest class (q8_0/q4_0, 6.5 bits → 8).
    """
    for cls in sorted(KV_BIT_CLASSES):
        if bits < cls * 1.5:
            return cls
    return 16


@dataclass(frozen=True)
class Group:
    """Results evaluated on the same tokens of the same model (comparable, pairable)."""

    index: int
    model: str
    data: str
    ctx: int
    tokens: int
    results: tuple[EvalResult, ...]
    replicate: int = 0  # r >= 1: a replicate's results (wkvlab.sweep.plan), run with prefill chunks of ``chunk``
    chunk: int = 0

    @property
    def label(self) -> str:
        return f"{self.model} · {self.data} · ctx {self.ctx} · {self.tokens} tokens{replicate_label(self.replicate, self.chunk)}"


def quantized_reference_note(group: Group) -> str:
    """Why weight configs sit right of 'none' on the memory chart when the model was loaded from a quantized file
    (a GGUF): 'none' is the file in its own blocks, the KLD reference is the file dequantized, and a config built
    from it stores more bytes than the file — so it falls off the memory front without being a mistake of the
    chart. '' when the loaded model is not smaller than every weight config (a 16-bit checkpoint)."""
    own = [r for r in group.results if r.weights_spec.get("method") == "none"]
    if not own:
        return ""
    stored = own[0].weight_bytes
    larger = sorted({(r.weight_bytes, r.weights) for r in group.results
                     if r.weights_spec.get("method") != "none" and r.weight_bytes > stored})
    if not larger:
        return ""
    mib = 2.0**20
    built = ", ".join(f"{w} {b / mib:,.1f} MiB" for b, w in larger)
    return (f"'{own[0].weights}' is the model as loaded, a quantized file ({stored / mib:,.1f} MiB in its own blocks), and every KLD "
            f"is against that file dequantized; weight configs built from it store more bytes than the file ({built}: "
            "16-bit embeddings and output matrix unless the config quantizes them, and their own scales), so they sit right "
            f"of '{own[0].weights}' and off the memory front: re-quantizing this file saves no memory, and their KLD is the rounding "
            "they add on top of the file's.")


def group_results(results: Sequence[EvalResult], replicates: Sequence[tuple[int, int]] = ()) -> list[Group]:
    """``replicates``: each result's (replicate, chunk), as a store's rows carry them (empty: every result is a
    measurement, replicate 0)."""
    keys: dict[tuple, list[EvalResult]] = {}
    for r, run in zip(results, replicates or [(0, 0)] * len(results), strict=True):
        fp = r.fingerprints or {}
        key = (r.model, fp.get("model_sha256"), r.data, fp.get("data_sha256"), r.ctx, r.tokens, *(run if run[0] else (0, 0)))
        keys.setdefault(key, []).append(r)
    return [Group(i, k[0], k[2], k[4], k[5], tuple(rs), k[6], k[7]) for i, (k, rs) in enumerate(keys.items())]


@dataclass(frozen=True)
class ConfigRow:
    group: int
    model: str
    data: str
    ctx: int
    tokens: int
    weights: str
    kv: str
    weights_16bit: bool
    kv_bits: float
    kv_class: int
    weight_bytes: int
    kv_bytes_per_token: float
    memory_bytes: float
    kld_mean: float
    kld_se: float
    kld_p99: float
    top1: float
    ppl: float
    ppl_ref: float
    pareto: bool

    def to_dict(self) -> dict:
        return asdict(self)


def config_rows(group: Group, context: int, batch: int) -> list[ConfigRow]:
    """One row per config of the group, with memory at ``context`` × ``batch`` and the Pareto flag."""
    memory = [memory_bytes(r.weight_bytes, r.kv_bytes_per_token, context, batch) for r in group.results]
    kld = [r.kld for r in group.results]
    front = set(pareto_front(memory, [k["mean"] for k in kld]))
    rows = []
    for i, r in enumerate(group.results):
        bits = kv_bits(r.kv_spec, head_dim_of(r))
        rows.append(ConfigRow(group.index, r.model, r.data, r.ctx, r.tokens, r.weights, r.kv,
                              r.weights_spec.get("method") in SIXTEEN_BIT_WEIGHT_METHODS, bits, kv_bit_class(bits),
                              int(r.weight_bytes), float(r.kv_bytes_per_token), memory[i], kld[i]["mean"], kld[i]["se"],
                              kld[i]["p99"], r.top1_agreement, r.ppl, r.ppl_ref, i in front))
    return rows


def same_tokens(a: EvalResult, b: EvalResult) -> bool:
    return np.array_equal(a.arrays.window, b.arrays.window) and np.array_equal(a.arrays.position, b.arrays.position)


def _baseline_weights(group: Group) -> str | None:
    """The 16-bit weight config the cross-terms start from: 'none' (KLD 0) when stored, else a cast."""
    for method in SIXTEEN_BIT_WEIGHT_METHODS:
        for r in group.results:
            if r.weights_spec.get("method") == method:
                return r.weights
    return None


def _cells(group: Group) -> dict[tuple[str, str], EvalResult]:
    return {(r.weights, r.kv): r for r in group.results}


def _kv_baseline(group: Group, weights: str) -> EvalResult | None:
    """(weights, 16-bit KV) of the group, or None."""
    for r in group.results:
        if r.weights == weights and KVSpec.from_dict(r.kv_spec).is_identity:
            return r
    return None


@dataclass(frozen=True)
class PenaltyRow:
    """What a KV config adds to one weight config's KLD: KLD(W, C) − KLD(W, 16-bit KV), paired by window."""

    group: int
    weights: str
    kv: str
    kv_class: int
    weight_bytes: int
    kld_16bit_kv: float
    kld: float
    penalty: Interval

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "penalty"}, "penalty": self.penalty.to_dict()}


def penalty_rows(group: Group) -> list[PenaltyRow]:
    rows = []
    for r in group.results:
        if KVSpec.from_dict(r.kv_spec).is_identity:
            continue
        base = _kv_baseline(group, r.weights)
        if base is None or not same_tokens(base, r):
            continue
        interval = paired_interval(lambda m: m["wc"] - m["w"], {"wc": r.arrays.kld, "w": base.arrays.kld}, r.arrays.units)
        rows.append(PenaltyRow(group.index, r.weights, r.kv, kv_bit_class(kv_bits(r.kv_spec, head_dim_of(r))), int(r.weight_bytes),
                               base.kld["mean"], r.kld["mean"], interval))
    return rows


@dataclass(frozen=True)
class CrossTermRow:
    """The 2×2 factorial interaction of one weight config W and one KV config C.

    interaction = KLD(W, C) − KLD(W, C₀) − KLD(W₀, C) + KLD(W₀, C₀), with W₀ the 16-bit weights and C₀
    the 16-bit cache. With W₀ = 'none' the last term is 0 and this is KLD(W+C) − KLD(W) − KLD(C):
    positive means the two quantizations hurt more together than their separate costs add up to.
    """

    group: int
    weights: str
    kv: str
    baseline_weights: str
    kld_both: float
    kld_weights: float
    kld_kv: float
    kld_baseline: float
    interaction: Interval
    verdict: Verdict | None = None  # the one rule: m = 10% of the predicted total (its draws in the test), Holm over the group's cross terms

    @property
    def additive(self) -> float:
        """What KLD(W, C) would be if the two costs simply added."""
        return self.kld_weights + self.kld_kv - self.kld_baseline

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("interaction", "verdict")}
        return {**out, "additive": self.additive, "interaction": self.interaction.to_dict(),
                "verdict": self.verdict.to_dict() if self.verdict is not None else None}


def cross_term_rows(group: Group) -> list[CrossTermRow]:
    w0 = _baseline_weights(group)
    if w0 is None:
        return []
    base00 = _kv_baseline(group, w0)
    if base00 is None:
        return []
    cells = _cells(group)
    found = []
    for (w, c), both in cells.items():
        if w == w0 or KVSpec.from_dict(both.kv_spec).is_identity:
            continue
        only_w, only_c = cells.get((w, base00.kv)), cells.get((w0, c))
        if only_w is None or only_c is None or not all(same_tokens(both, x) for x in (only_w, only_c, base00)):
            continue
        arrays = {"wc": both.arrays.kld, "w": only_w.arrays.kld, "c": only_c.arrays.kld, "0": base00.arrays.kld}
        draws = resample(lambda m: m["wc"] - m["w"] - m["c"] + m["0"], arrays, both.arrays.units)
        # the weights' and the cache's own costs on the same units: the predicted total the margin is a share of
        own_w, own_c = (resample(lambda m, x=x: m[x] - m["0"], arrays, both.arrays.units) for x in ("w", "c"))
        found.append((CrossTermRow(group.index, w, c, w0, both.kld["mean"], only_w.kld["mean"], only_c.kld["mean"],
                                   base00.kld["mean"], draws.interval()),
                      MarginRule().interaction_effect(f"{w} × {c}", draws, own_w, own_c, int(both.arrays.kld.size))))
    verdicts = decide([e for _, e in found], family=f"group {group.index} cross terms")
    return [replace(row, verdict=v) for (row, _), v in zip(found, verdicts)]


def position_edges(ctx: int, first: int = 16) -> list[int]:
    """Bucket edges doubling from ``first``: the start of a window changes fastest."""
    edges = [0]
    edge = first
    while edge < ctx:
        edges.append(edge)
        edge *= 2
    return edges + [ctx]


@dataclass(frozen=True)
class PositionCurve:
    group: int
    weights: str
    kv: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]  # exclusive
    kld_mean: tuple[float, ...]
    tokens: tuple[int, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def position_curve(group: int, result: EvalResult) -> PositionCurve:
    """Mean KLD per position bucket (empty buckets, e.g. unscored first halves, are left out)."""
    edges = position_edges(result.ctx)
    pos, kld = result.arrays.position, result.arrays.kld
    bucket = np.searchsorted(edges, pos, side="right") - 1
    counts = np.bincount(bucket, minlength=len(edges))
    sums = np.bincount(bucket, weights=kld.astype(np.float64), minlength=len(edges))
    keep = [b for b in range(len(edges) - 1) if counts[b]]
    return PositionCurve(group, result.weights, result.kv, tuple(edges[b] for b in keep), tuple(edges[b + 1] for b in keep),
                         tuple(float(sums[b] / counts[b]) for b in keep), tuple(int(counts[b]) for b in keep))


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, for every group."""

    source: str
    context: int
    batch: int
    groups: tuple[Group, ...]
    configs: tuple[ConfigRow, ...]
    penalties: tuple[PenaltyRow, ...]
    cross_terms: tuple[CrossTermRow, ...]
    positions: tuple[PositionCurve, ...]

    def in_group(self, rows, group: int) -> list:
        return [r for r in rows if r.group == group]

    def to_dict(self) -> dict:
        return {
            "source": self.source, "context": self.context, "batch": self.batch,
            "groups": [{"index": g.index, "label": g.label, "model": g.model, "data": g.data, "ctx": g.ctx, "tokens": g.tokens,
                        "replicate": g.replicate, "note": quantized_reference_note(g)} for g in self.groups],
            "configs": [r.to_dict() for r in self.configs],
            "kv_penalties": [r.to_dict() for r in self.penalties],
            "cross_terms": [r.to_dict() for r in self.cross_terms],
            "positions": [r.to_dict() for r in self.positions],
        }


def build_report_data(results: Sequence[EvalResult], *, source: str, context: int = 8192, batch: int = 1,
                      replicates: Sequence[tuple[int, int]] = ()) -> ReportData:
    """``replicates``: each result's (replicate, chunk), as :func:`group_results` takes them."""
    if not results:
        raise DataError(f"{source} holds no results; run 'wkvlab sweep <spec.yaml> --store <file>' or 'wkvlab demo --report <dir>' first")
    memory_bytes(0, 0.0, context, batch)  # checks --context and --batch before any work
    groups = group_results(results, replicates)
    return ReportData(
        source, context, batch, tuple(groups),
        tuple(row for g in groups for row in config_rows(g, context, batch)),
        tuple(row for g in groups for row in penalty_rows(g)),
        tuple(row for g in groups for row in cross_term_rows(g)),
        tuple(position_curve(g.index, r) for g in groups for r in g.results),
    )
