"""The attention finding: where, inside attention, the weight × cache cross term sits.

The additivity finding measures *whether* 4-bit weights and a 4-bit cache compound at the output
(KLD). This one looks inside attention for every weight method × cache it asks about, with
:func:`wkvlab.explain.attention.attention_decomposition`: the score error of the candidate
(quantized weights, quantized cache) against the reference splits exactly into a KV term Q·ε_kᵀ, a
weight term ε_q·Kᵀ and a cross term ε_q·ε_kᵀ. Per configuration it reports

* each term's share of the summed term energy over the whole network, the cross share with a
  bootstrap interval over windows (the decomposition is run window by window, so a window is the
  resampling unit, as in the additivity finding, and the shares are ratios of summed energies);
* how the cross term treats the attention sinks: its RMS on the first keys over its RMS on the
  other keys (1 = no different), with the same interval;
* the layers holding most of the cross term's energy, and the mean attention-row KL.

ε_q is the candidate's query minus the reference's: it carries the weight error *and* the cache
error of every earlier layer (the hidden state that makes the query went through quantized
attention). So a cross term exists even under unquantized weights, from layer 1 on; the grid's
``none`` row measures that baseline, and the weight methods' rows are read against it.

ε_k likewise carries the weight-induced key error, so the cross term is split (issue #24) into its
weight part ε_q·ε_k,wᵀ and its cache part ε_q·ε_k,cᵀ, and the attention-level 2×2 interaction
S_WC − S_W − S_C + S_R is reported as its share of the score-error energy (docs/explain.md). Every
weight config also gets its (W, fp16) row: with a 16-bit cache the whole cross term is weight part,
which is the baseline the cache rows' weight parts are read against.

The windows and the calibration are the additivity grid's (the same text, the same calibration
samples), so the quantized weights come from the on-disk cache when that finding ran first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from wkvlab.stats import Interval

Tick = Callable[[str, float], None]
TOP_LAYERS = 3


@dataclass(frozen=True)
class AttentionRow:
    """One weight config × cache: where its score error comes from, pooled over the windows."""

    weights: str
    kv: str
    windows: int
    shares: dict[str, Interval]  # "kv", "weight", "cross" (and its parts "cross_weight", "cross_cache"): of the summed term energy;
    # "interaction": the attention-level 2×2 interaction's energy over the score error's
    cross_sink_ratio: Interval  # RMS of the cross term on the sink keys / on the other keys
    sink_tokens: int
    layer_cross_mass: list[float]  # per layer: its share of the network's cross-term energy
    attention_kl: float  # mean KL between reference and candidate attention rows, nats

    @property
    def top_layers(self) -> list[tuple[int, float]]:
        """(layer, share of the cross-term energy) of the :data:`TOP_LAYERS` layers holding most of it."""
        order = np.argsort(self.layer_cross_mass, kind="stable")[::-1][:TOP_LAYERS]
        return [(int(l), float(self.layer_cross_mass[l])) for l in order]

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "windows": self.windows,
                "shares": {k: v.to_dict() for k, v in self.shares.items()}, "cross_sink_ratio": self.cross_sink_ratio.to_dict(),
                "sink_tokens": self.sink_tokens, "top_layers": [{"layer": l, "cross_mass": m} for l, m in self.top_layers],
                "layer_cross_mass": self.layer_cross_mass, "attention_kl": self.attention_kl}

    @classmethod
    def from_dict(cls, data: dict) -> "AttentionRow":
        return cls(data["weights"], data["kv"], data["windows"], {k: Interval.from_dict(v) for k, v in data["shares"].items()},
                   Interval.from_dict(data["cross_sink_ratio"]), data["sink_tokens"], data["layer_cross_mass"], data["attention_kl"])


def pooled(parts: list):
    """One :class:`AttentionDecomposition` of all windows from the per-window ones (its sums add)."""
    from dataclasses import replace

    first = parts[0]
    return replace(first, n_windows=sum(p.n_windows for p in parts), sumsq={t: sum(p.sumsq[t] for p in parts) for t in first.sumsq},
                   pairs=sum(p.pairs for p in parts), kl_sum=sum(p.kl_sum for p in parts), kl_rows=sum(p.kl_rows for p in parts),
                   ref_sumsq=sum(p.ref_sumsq for p in parts))


def pooled_row(weights: str, kv: str, parts: list) -> AttentionRow:
    """Pool per-window :class:`AttentionDecomposition` results into one row with window-bootstrap intervals.

    The shares and the sink ratio are ratios of sums over windows, so they are functions of the
    per-window sums' means: :func:`wkvlab.stats.paired_interval` with one "token" per window and the
    window as unit (its point estimates are the pooled decomposition's own ``network_shares`` and
    ``sink_ratio``); the layers and the KL come from the pooled decomposition.
    """
    from wkvlab.stats import paired_interval

    energy = {t: np.array([p.sumsq[t].sum() for p in parts]) for t in ("kv", "weight", "cross", "cross_weight", "cross_cache",
                                                                       "interaction", "total")}
    heads = parts[0].heads
    arrays = {**energy,
              "cross_sinks": np.array([p.sumsq["cross"][..., 0].sum() for p in parts]),
              "cross_rest": np.array([p.sumsq["cross"][..., 1].sum() for p in parts]),
              "pairs_sinks": np.array([p.pairs[:, 0].sum() * heads for p in parts]),
              "pairs_rest": np.array([p.pairs[:, 1].sum() * heads for p in parts])}
    units = np.arange(len(parts))

    def share(term: str):
        return lambda m: m[term] / (m["kv"] + m["weight"] + m["cross"])

    shares = {t: paired_interval(share(t), arrays, units) for t in ("kv", "weight", "cross", "cross_weight", "cross_cache")}
    shares["interaction"] = paired_interval(lambda m: m["interaction"] / m["total"], arrays, units)
    ratio = paired_interval(lambda m: np.sqrt((m["cross_sinks"] / m["pairs_sinks"]) / (m["cross_rest"] / m["pairs_rest"])), arrays, units)
    whole = pooled(parts)
    mass = [float(m) for m in whole.cross_mass().sum(1)]
    return AttentionRow(weights, kv, len(parts), shares, ratio, whole.sink_tokens, mass, float(whole.kl().mean()))


def measure_attention(model: str, weights: tuple[str, ...], kvs: tuple[str, ...], *, ctx: int, windows: int,
                      progress=None, device: str = "auto", dtype: str = "auto") -> list[AttentionRow]:
    """Decompose the first ``windows`` windows of ``ctx`` tokens of the default text (the additivity
    grid's) for every weight config × cache, one weight-quantized copy at a time.

    ``progress(total, title)``: a context yielding ``tick(description, steps)`` (the findings' bars)."""
    from contextlib import nullcontext

    import torch

    from wkvlab import api
    from wkvlab.explain.attention import attention_decomposition
    from wkvlab.explain.run import kv_stats_under
    from wkvlab.kv.hook import layer_stores
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import resolve_device, resolve_dtype
    from wkvlab.weights.apply import quantize_model_weights
    from wkvlab.weights.spec import WeightSpec

    resolved = resolve_device(device)
    work = api.prepare(model, "default", ctx=ctx, tokens=windows * ctx, device=resolved, dtype=resolve_dtype(dtype, resolved))
    w_specs, c_specs = [WeightSpec.parse(w) for w in weights], [KVSpec.parse(k) for k in kvs]
    if not any(c.is_identity for c in c_specs):  # every weight config's (W, fp16) row: the cross term without a cache
        c_specs = [KVSpec.parse("fp16"), *c_specs]
    api.check_kv_specs(work.loaded.model, c_specs)
    calibration = api.prepare_calibration(work, w_specs, None, c_specs)
    chosen = work.windows.tokens
    pairs = [(w, c) for w in w_specs for c in c_specs if not (w.is_identity and c.is_identity)]  # the identity has no error
    total = len(pairs) * chosen.shape[0]
    bar = progress(total, f"attention: {len(w_specs)} weight configs x {len(c_specs)} caches x {chosen.shape[0]} windows") \
        if progress is not None else nullcontext(lambda _d, _n: None)
    rows = []
    with bar as tick, torch.no_grad():
        for w_spec in w_specs:
            quantized = quantize_model_weights(work.loaded.model, w_spec, calibration, model_key=work.loaded.fingerprint)
            for c_spec in [c for w, c in pairs if w is w_spec]:
                stats = kv_stats_under(quantized, c_spec, calibration, work.loaded.fingerprint)
                stores = layer_stores(quantized.model, c_spec, stats)
                parts = []
                for w in range(chosen.shape[0]):
                    parts.append(attention_decomposition(work.loaded.model, quantized.model, c_spec, chosen[w : w + 1],
                                                         weights_label=w_spec.label, stores=stores))
                    tick(f"{w_spec.label} × {c_spec.label}", 1)
                rows.append(pooled_row(w_spec.label, c_spec.label, parts))
            del quantized
    return rows


__all__ = ["AttentionRow", "measure_attention", "pooled", "pooled_row"]
