"""Measured mitigations of the weight × KV combination: which change to the cache recovers most.

The quantity a KV-side mitigation can recover is everything the quantized cache adds on top of
the quantized weights, ``excess = KLD(W+C) − KLD(W)`` (the cross term included). Each mitigation
C' is evaluated with the same weights on the same windows, and reported as

    recovered = (KLD(W+C) − KLD(W+C')) / (KLD(W+C) − KLD(W))

with a paired interval (1 = the cache costs nothing any more, 0 = no help, negative =
worse), next to the bytes per token it costs — a mitigation is a trade of memory for quality.

The candidates follow what engines offer and the literature recommends:

* keep layers at 16 bits (vLLM ``--kv-cache-dtype-skip-layers``): the layers where the attention
  decomposition places the cross term (attention.py), and the first/last N layers, with N chosen
  from the same ranking (early layers hold attention sinks, late ones have no layer left to
  correct an error);
* keep the first 4 tokens (attention sinks) at 16 bits (StreamingLLM; KIVI/KVQuant keep sinks too);
* keys at higher precision than values (KIVI, KVQuant: keys carry outlier channels and enter the
  softmax, values are averaged) — e.g. K8V4 when C is K4V4.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from wkvlab.eval.result import EvalResult
from wkvlab.kv.formats import get_kv_format
from wkvlab.kv.spec import KVSpec
from wkvlab.stats import Interval, paired_interval, resample
from wkvlab.stats.decision import DEFAULT_MARGIN, MarginRule, Verdict, decide

SINK_TOKENS = 4
HIGH_PRECISION_BITS = 7.0  # a K format under this many bits per value gets an 8-bit sibling


@dataclass(frozen=True)
class Candidate:
    """A mitigation to measure: its name, the KV spec that implements it, and why it was chosen."""

    name: str
    kv: KVSpec
    why: str


def _bits_per_value(name: str, head_dim: int) -> float:
    return get_kv_format(name).bytes_per_vector(head_dim) * 8.0 / head_dim


def higher_key_format(k: str, head_dim: int) -> str | None:
    """An 8-bit K of the same family for a K under 8 bits (q4_0 → q8_0, int4 → int8), 16-bit for 8-bit K."""
    fmt = get_kv_format(k)
    if fmt.is_identity:
        return None
    if _bits_per_value(k, head_dim) >= HIGH_PRECISION_BITS:
        return "fp16"
    if fmt.name.startswith(("q", "iq")) and head_dim % 32 == 0:
        return "q8_0"
    if fmt.name.startswith("fp4"):
        return "fp8_e4m3"
    return "int8"


def layers_holding(shares: Sequence[float], fraction: float = 0.5, cap: int = 4) -> list[int]:
    """The fewest layers (at most ``cap``) that together hold ``fraction`` of the total share, largest first."""
    order = np.argsort(-np.asarray(shares, dtype=np.float64), kind="stable")
    total = float(np.sum(shares))
    chosen, held = [], 0.0
    for layer in order[:cap]:
        chosen.append(int(layer))
        held += float(shares[layer])
        if total > 0 and held >= fraction * total:
            break
    return sorted(chosen)


def edge_depth(layers: Sequence[int], n_layers: int, from_end: bool, default: int = 2) -> int:
    """N for "skip the first/last N layers": reach the deepest chosen layer in that quarter of the model."""
    quarter = max(1, n_layers // 4)
    inside = [(n_layers - 1 - i) if from_end else i for i in layers]
    inside = [d for d in inside if d < quarter]
    return max(inside) + 1 if inside else default


def _with_skip(kv: KVSpec, layers: Sequence[int]) -> KVSpec:
    return replace(kv, skip=tuple(sorted(set(kv.skip) | set(layers), key=str)), name="")


def candidates(kv: KVSpec, n_layers: int, head_dim: int, layer_shares: Sequence[float] | None = None) -> list[Candidate]:
    """The mitigations worth measuring for cache config ``kv`` on a model of ``n_layers`` layers.

    ``layer_shares``: per layer, its share of the cross term (or of the score error) from the
    attention decomposition; None when that diagnosis was skipped (then N defaults to 2).
    """
    out: list[Candidate] = []
    base = replace(kv, name="")
    ranked = layers_holding(layer_shares) if layer_shares is not None else []
    source = "the attention decomposition's cross-term share" if ranked else "no decomposition run: the common default"
    if ranked:
        out.append(Candidate(f"16-bit layers {','.join(map(str, ranked))}", _with_skip(base, ranked),
                             f"the fewest layers holding half the cross term ({source})"))
    first = edge_depth(ranked, n_layers, from_end=False)
    last = edge_depth(ranked, n_layers, from_end=True)
    out.append(Candidate(f"16-bit first {first} layers", _with_skip(base, range(first)), f"N={first} from {source}"))
    out.append(Candidate(f"16-bit last {last} layers", _with_skip(base, range(n_layers - last, n_layers)), f"N={last} from {source}"))
    if kv.sinks < SINK_TOKENS and not kv.sink_ratio:
        out.append(Candidate(f"first {SINK_TOKENS} tokens 16-bit", replace(base, sinks=SINK_TOKENS), "attention sinks (StreamingLLM)"))
    k_high = higher_key_format(kv.k, head_dim)
    if k_high is not None and not kv.layers:
        out.append(Candidate(f"K {k_high}, V {kv.v}", replace(base, k=k_high), "keys carry outlier channels (KIVI, KVQuant)"))
    unique: dict[str, Candidate] = {}
    for c in out:  # the same spec reached two ways is measured once
        unique.setdefault(c.kv.canonical(), c)
    return list(unique.values())


@dataclass(frozen=True)
class MitigationResult:
    name: str
    kv: str
    why: str
    kv_bytes_per_token: float
    kld: Interval  # KLD(W + C')
    recovered: Interval  # share of KLD(W+C) − KLD(W) recovered
    top1: Interval  # agreement(W + C') − agreement(W + C)
    verdict: Verdict | None = None  # the one rule on the recovered share (m = 10% of the excess), Holm over the mitigations

    def to_dict(self) -> dict:
        return {"name": self.name, "kv": self.kv, "why": self.why, "kv_bytes_per_token": self.kv_bytes_per_token,
                "kld": self.kld.to_dict(), "recovered": self.recovered.to_dict(), "top1": self.top1.to_dict(),
                "verdict": self.verdict.to_dict() if self.verdict else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "MitigationResult":
        return cls(d["name"], d["kv"], d["why"], d["kv_bytes_per_token"], Interval.from_dict(d["kld"]),
                   Interval.from_dict(d["recovered"]), Interval.from_dict(d["top1"]),
                   Verdict.from_dict(d["verdict"]) if d.get("verdict") else None)


@dataclass(frozen=True)
class Mitigations:
    """Every measured mitigation of W+C, lowest KLD (most recovered) first."""

    weights: str
    kv: str
    kv_bytes_per_token: float
    excess: Interval  # KLD(W+C) − KLD(W)
    results: tuple[MitigationResult, ...]
    # the one rule on the excess (m = 10% of KLD(W+C)): only an excess decided above +m is there to recover
    excess_verdict: Verdict | None = None

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "kv_bytes_per_token": self.kv_bytes_per_token,
                "excess": self.excess.to_dict(), "results": [r.to_dict() for r in self.results],
                "excess_verdict": self.excess_verdict.to_dict() if self.excess_verdict else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Mitigations":
        return cls(d["weights"], d["kv"], d["kv_bytes_per_token"], Interval.from_dict(d["excess"]),
                   tuple(MitigationResult.from_dict(r) for r in d["results"]),
                   Verdict.from_dict(d["excess_verdict"]) if d.get("excess_verdict") else None)

    @property
    def best(self) -> MitigationResult | None:
        return self.results[0] if self.results else None

    def lines(self) -> list[str]:
        best = self.best
        if best is None:
            return []
        v = self.excess_verdict
        if v is not None and v.outcome != "above":  # a share of nothing decided is noise divided by noise
            return [f"the cache's excess over the quantized weights (KLD(W+C) − KLD(W)) is {v.describe('.4f')}: "
                    f"nothing decided for a KV mitigation to recover; lowest KLD {best.kld.estimate:.4f} with {best.name} ({best.kv})"]
        if v is None and not self.excess.excludes_zero:  # stored before the excess had a verdict
            return [f"the cache adds no measurable excess over the quantized weights (KLD(W+C) − KLD(W) = {self.excess:.4f}): "
                    f"nothing for a KV mitigation to recover; lowest KLD {best.kld.estimate:.4f} with {best.name} ({best.kv})"]
        rule = f"; {best.verdict.describe('.0%')}" if best.verdict is not None else \
            ("" if best.recovered.excludes_zero else " — not distinguishable from no help")
        return [f"best mitigation: {best.name} ({best.kv}) recovers {best.recovered:.0%} of the cache's excess "
                f"{self.excess.estimate:.4f} KLD at {best.kv_bytes_per_token:,.0f} vs {self.kv_bytes_per_token:,.0f} bytes/token{rule}"]


RECOVERY = ("recovers", "adds to the excess", "no help within ±m")
EXCESS = ("an excess", "below the quantized weights alone", "no excess within ±m")


def measure(cells: Mapping[str, EvalResult], mitigated: Sequence[EvalResult], chosen: Sequence[Candidate], *,
            margin: float = DEFAULT_MARGIN) -> Mitigations:
    """Mitigation results from the factorial's W and W+C cells and W+C' results on the same windows."""
    from wkvlab.explain.compare import check_same_tokens

    w, wc = cells["w"], cells["wc"]
    arrays = {"w": w.arrays.kld, "wc": wc.arrays.kld, "agree_wc": wc.arrays.top1_agree.astype(np.float64)}
    for i, result in enumerate(mitigated):
        check_same_tokens(wc, result)
        arrays[f"m{i}"] = result.arrays.kld
        arrays[f"agree_m{i}"] = result.arrays.top1_agree.astype(np.float64)

    def interval(statistic) -> Interval:
        return paired_interval(statistic, arrays, wc.arrays.units)

    rows, effects = [], []
    for i, (candidate, result) in enumerate(zip(chosen, mitigated)):
        m = f"m{i}"
        with np.errstate(divide="ignore", invalid="ignore"):  # no excess at all: share undefined (nan)
            share = resample(lambda s, m=m: (s["wc"] - s[m]) / (s["wc"] - s["w"]), arrays, wc.arrays.units)
        # the share is already relative to the excess: m = 10% of all of it
        effects.append(MarginRule.parse(margin).difference_effect(f"{candidate.name}: share recovered", share, 1.0,
                                                                   "the cache's excess (share)", wc.tokens, words=RECOVERY))
        rows.append(MitigationResult(candidate.name, candidate.kv.label, candidate.why, result.kv_bytes_per_token,
                                     kld=interval(lambda s, m=m: s[m]), recovered=share.interval(),
                                     top1=interval(lambda s, m=m: s[f"agree_{m}"] - s["agree_wc"])))
    verdicts = decide(effects, family=f"{len(effects)} mitigations of {wc.weights} × {wc.kv}")
    rows = [replace(r, verdict=v) for r, v in zip(rows, verdicts)]
    # lowest KLD first: the same order as "most recovered" when the excess is positive, and still
    # meaningful when the excess is noise around zero (the share's sign then flips at random)
    rows.sort(key=lambda r: r.kld.estimate)
    excess = resample(lambda s: s["wc"] - s["w"], arrays, wc.arrays.units)
    own = resample(lambda s: s["wc"], arrays, wc.arrays.units)  # the margin's basis, same units
    (excess_verdict,) = decide([MarginRule.parse(margin).difference_effect("cache excess KLD(W+C) − KLD(W)", excess, own, "KLD(W+C)",
                                                                           wc.tokens, unit="nats", words=EXCESS)],
                               family="cache excess over the quantized weights")
    return Mitigations(w.weights, wc.kv, wc.kv_bytes_per_token, excess.interval(), tuple(rows), excess_verdict)
