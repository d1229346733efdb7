"""The attention finding: where, inside attention, the weight × cache cross term sits, and how much of
the output interaction it carries.

The additivity finding measures *whether* 4-bit weights and a 4-bit cache compound at the output
(KLD). This one looks inside attention for every weight method × cache it asks about, with
:func:`wkvlab.explain.attention.decompose_window` on four whole passes of each window — R
(reference), W (quantized weights, 16-bit cache), C (reference weights, quantized cache) and W+C:

* the score error of W+C splits exactly into a KV term Q·ε_kᵀ, a weight term ε_q·Kᵀ and a cross
  term ε_q·ε_kᵀ, and the cross term into its weight part ε_q·ε_k,wᵀ (ε_k,w = K_W − K, the (W, fp16)
  pass's key) and its cache part ε_q·ε_k,cᵀ (ε_k,c = K_stored − K_W); each term's share of the summed
  term energy with a bootstrap interval over windows, and the attention-level 2×2 interaction
  S_WC − S_W − S_C + S_R as its share of the score-error energy;
* for each pair with both quantized, the interventions of :mod:`wkvlab.explain.intervention`: the
  (W, C) run with ε_q·ε_k,cᵀ removed from its scores (the share of the output KLD interaction that
  carries) and with the first 4 tokens at 16 bits in its cache (sink sensitivity, paired against the
  plain run), and the output and attention-KL interactions, all decided by the one rule
  (margin 10% of KLD(C), the whole table one Holm family);
* the layers holding most of the cross term's energy, and the mean attention-row KL.

Every weight config gets its (W, fp16) row (the cross term without a cache: all weight part), and
the ``none`` row measures the cross term unquantized weights already have (ε_q carries the cache
error of earlier layers).

One model copy: the reference's R and C passes run once per window and are kept on disk
(:class:`wkvlab.explain.cells.Spill`), then each weight config is built *in place* on the loaded
model (its originals kept by :class:`~wkvlab.weights.restore.WeightSnapshot` and written back
after it). The windows and the calibration are the additivity grid's (the same text, the same
calibration samples), so the quantized weights come from the on-disk cache when that finding ran
first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from wkvlab.explain.crossterm import CrossTerm
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
    sink_tokens: int
    layer_cross_mass: list[float]  # per layer: its share of the network's cross-term energy
    attention_kl: float  # mean KL between reference and candidate attention rows, nats
    cross: "CrossTerm | None" = None  # the interventions and verdicts (pairs with both quantized)

    @property
    def top_layers(self) -> list[tuple[int, float]]:
        """(layer, share of the cross-term energy) of the :data:`TOP_LAYERS` layers holding most of it."""
        order = np.argsort(self.layer_cross_mass, kind="stable")[::-1][:TOP_LAYERS]
        return [(int(l), float(self.layer_cross_mass[l])) for l in order]

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "windows": self.windows,
                "shares": {k: v.to_dict() for k, v in self.shares.items()},
                "sink_tokens": self.sink_tokens, "top_layers": [{"layer": l, "cross_mass": m} for l, m in self.top_layers],
                "layer_cross_mass": self.layer_cross_mass, "attention_kl": self.attention_kl,
                "cross": self.cross.to_dict() if self.cross is not None else None}

    @classmethod
    def from_dict(cls, data: dict) -> "AttentionRow":
        """A stored row; rows stored before the interventions have no ``cross`` (their RMS sink ratio is not read)."""
        cross = CrossTerm.from_dict(data["cross"]) if data.get("cross") else None
        return cls(data["weights"], data["kv"], data["windows"], {k: Interval.from_dict(v) for k, v in data["shares"].items()},
                   data["sink_tokens"], data["layer_cross_mass"], data["attention_kl"], cross)


def pooled_row(weights: str, kv: str, parts: list) -> AttentionRow:
    """Pool per-window :class:`AttentionDecomposition` results into one row with window-bootstrap intervals.

    The shares and the sink ratio are ratios of sums over windows, so they are functions of the
    per-window sums' means: :func:`wkvlab.stats.paired_interval` with one "token" per window and the
    window as unit (its point estimates are the pooled decomposition's own ``network_shares``);
    the layers and the KL come from the pooled decomposition.
    """
    from wkvlab.stats import paired_interval

    energy = {t: np.array([p.sumsq[t].sum() for p in parts]) for t in ("kv", "weight", "cross", "cross_weight", "cross_cache",
                                                                       "interaction", "total")}
    arrays = energy
    units = np.arange(len(parts))

    def share(term: str):
        return lambda m: m[term] / (m["kv"] + m["weight"] + m["cross"])

    shares = {t: paired_interval(share(t), arrays, units) for t in ("kv", "weight", "cross", "cross_weight", "cross_cache")}
    shares["interaction"] = paired_interval(lambda m: m["interaction"] / m["total"], arrays, units)
    from wkvlab.explain.attention import pooled

    whole = pooled(parts)
    mass = [float(m) for m in whole.cross_mass().sum(1)]
    return AttentionRow(weights, kv, len(parts), shares, whole.sink_tokens, mass, float(whole.kl().mean()))


def measure_attention(model: str, weights: tuple[str, ...], kvs: tuple[str, ...], *, ctx: int, windows: int,
                      progress=None, device: str = "auto", dtype: str = "auto", margin: float | None = None) -> list[AttentionRow]:
    """Decompose the first ``windows`` windows of ``ctx`` tokens of the default text (the additivity
    grid's) for every weight config × cache, and run the interventions where both are quantized.

    ``progress(total, title)``: a context yielding ``tick(description, steps)`` (the findings' bars).
    ``margin``: the rule's margin as a fraction of KLD(C) (default 10%)."""
    from contextlib import nullcontext

    import torch

    from wkvlab import api
    from wkvlab.explain.cells import Spill, record_pass
    from wkvlab.explain.crossterm import cross_terms
    from wkvlab.explain.run import kv_stats_under
    from wkvlab.kv.hook import layer_stores
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import resolve_device, resolve_dtype
    from wkvlab.stats.decision import DEFAULT_MARGIN
    from wkvlab.weights.apply import quantize_model_weights
    from wkvlab.weights.restore import WeightSnapshot
    from wkvlab.weights.spec import WeightSpec

    resolved = resolve_device(device)
    work = api.prepare(model, "default", ctx=ctx, tokens=windows * ctx, device=resolved, dtype=resolve_dtype(dtype, resolved))
    w_specs, c_specs = [WeightSpec.parse(w) for w in weights], [KVSpec.parse(k) for k in kvs]
    fp16 = KVSpec.parse("fp16")
    if not any(c.is_identity for c in c_specs):  # every weight config's (W, fp16) row: the cross term without a cache
        c_specs = [fp16, *c_specs]
    api.check_kv_specs(work.loaded.model, c_specs)
    calibration = api.prepare_calibration(work, w_specs, None, c_specs)
    net, key = work.loaded.model, work.loaded.fingerprint
    chosen = work.windows.tokens
    n = chosen.shape[0]
    caches = [c for c in c_specs if not c.is_identity]
    pairs = [(w, c) for w in w_specs for c in c_specs if not (w.is_identity and c.is_identity)]  # the identity has no error
    total = n * (1 + len(caches) + sum(not w.is_identity for w in w_specs)) + len(pairs) * n
    bar = progress(total, f"attention: {len(w_specs)} weight configs x {len(c_specs)} caches x {n} windows") \
        if progress is not None else nullcontext(lambda _d, _n: None)
    rows, data = [], []
    with Spill() as spill, bar as tick, torch.no_grad():
        # the reference's passes (R, and C for every cache) once per window, for every weight config
        unquantized = quantize_model_weights(net, WeightSpec.parse("none"))
        ref_stores = {c.label: layer_stores(net, c, kv_stats_under(unquantized, c, calibration, key)) for c in caches}
        for i in range(n):
            ids = chosen[i : i + 1]
            spill.put(("R", i), record_pass(net, fp16, ids))
            tick("reference pass", 1)
            for c in caches:
                spill.put((c.label, i), record_pass(net, c, ids, ref_stores[c.label]))
                tick(f"none × {c.label}", 1)
        del ref_stores
        snapshot = WeightSnapshot(net, w_specs) if any(not (w.is_identity or w.is_checkpoint) for w in w_specs) else None
        try:
            for w_spec in w_specs:
                in_place = snapshot is not None and not (w_spec.is_identity or w_spec.is_checkpoint)
                built = quantize_model_weights(net, w_spec, calibration, model_key=key, in_place=in_place, originals=snapshot if in_place else None)
                try:
                    rows_w, data_w = _one_weight_config(built, w_spec, [c for w, c in pairs if w is w_spec], chosen, spill, calibration, key, tick)
                finally:
                    if in_place:
                        snapshot.restore(net, built.hooks)  # the next weight config starts from the original weights
                    del built
                rows += rows_w
                data += data_w
        finally:
            if snapshot is not None:
                snapshot.close()
    margin = DEFAULT_MARGIN if margin is None else margin
    crossed = cross_terms([(w, c, d) for w, c, d in data], family=f"attention finding: {len(data)} (W, C) pairs × 5 effects", margin=margin)
    by_pair = {(x.weights, x.kv): x for x in crossed}
    from dataclasses import replace

    return [replace(r, cross=by_pair.get((r.weights, r.kv))) for r in rows]


def _one_weight_config(built, w_spec, c_specs, chosen, spill, calibration, key, tick):
    """Every cache's row under one weight config (the model holds these weights now)."""
    from wkvlab.explain.attention import SINK_TOKENS, _Accumulator, decompose_window
    from wkvlab.explain.cells import record_pass
    from wkvlab.explain.crossterm import CrossTermData
    from wkvlab.explain.intervention import sinks_kept, window_cells
    from wkvlab.explain.run import kv_stats_under
    from wkvlab.kv.hook import layer_stores
    from wkvlab.kv.spec import KVSpec

    net = built.model
    cfg = net.config.get_text_config()
    fp16 = KVSpec.parse("fp16")
    stores, sink_stores = {}, {}
    for c in c_specs:
        stats = kv_stats_under(built, c, calibration, key)
        stores[c.label] = layer_stores(net, c, stats)
        kept = sinks_kept(c)
        sink_stores[c.label] = None if kept == c else layer_stores(net, kept, stats)
    parts = {c.label: [] for c in c_specs}
    data = {c.label: CrossTermData.empty() for c in c_specs if not (c.is_identity or w_spec.is_identity)}
    for i in range(chosen.shape[0]):
        ids = chosen[i : i + 1]
        ref = spill.get(("R", i))
        w = ref if w_spec.is_identity else record_pass(net, fp16, ids)
        if not w_spec.is_identity:
            tick(f"{w_spec.label} × fp16 pass", 1)
        for c in c_specs:
            cell_c = ref if c.is_identity else spill.get((c.label, i))
            if c.label in data:
                decomposition, kld, attention_kl = window_cells(net, c, ids, stores[c.label], sink_stores[c.label], (ref, w, cell_c),
                                                                weights_label=w_spec.label)
                data[c.label].add(kld, attention_kl)
            else:
                acc = _Accumulator(cfg.num_hidden_layers, cfg.num_attention_heads)
                decompose_window(net, c, ids, stores[c.label], (ref, w, cell_c), acc)
                decomposition = acc.result(w_spec.label, c.label, ids, SINK_TOKENS)
            parts[c.label].append(decomposition)
            tick(f"{w_spec.label} × {c.label}", 1)
            del cell_c
    rows = [pooled_row(w_spec.label, c.label, parts[c.label]) for c in c_specs]
    return rows, [(w_spec.label, label, d) for label, d in data.items()]


__all__ = ["AttentionRow", "measure_attention", "pooled_row"]
