"""Predicted quality of a weight x KV combination: measured when wkvlab has it, else a prior.

The unit is the mean KL divergence to the bf16 model (nats/token), the metric wkvlab measures.
Priors come from ``data/quality_priors.yaml`` (each with its source) and are combined
additively — the seed study's KV penalties on Q8_0 weights are additive to within noise
(0.0007 + 0.0027 ~ 0.0034) — with two documented adjustments: K and V weigh differently, and
sub-8-bit caches get worse with context. Measured values, keyed by the canonical
``(weights, kv)`` strings, replace the prior for that combination and are labeled "measured".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

import yaml

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.kv import KVLayout, KVPair, kv_format, with_16bit_as
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.weights import WeightSpec

MEASURED = "measured"
PRIOR_LITERATURE = "prior (literature)"
PRIOR_EXTRAPOLATED = "prior (extrapolated)"

MeasuredQuality = Mapping[tuple[str, str], float]


@dataclass(frozen=True)
class QualityEstimate(JsonMixin):
    kld: float
    source: str  # measured | prior (literature) | prior (extrapolated)
    weights_kld: float | None
    kv_kld: float | None
    detail: tuple[str, ...]


_PRIORS: dict[str, Any] | None = None


def priors() -> dict[str, Any]:
    global _PRIORS
    if _PRIORS is None:
        text = resources.files("wkvlab.plan").joinpath("data/quality_priors.yaml").read_text()
        _PRIORS = yaml.safe_load(text)
    return _PRIORS


def estimate_quality(model: ModelDescription, weights: WeightSpec, kv: KVLayout, ctx: int,
                     measured: MeasuredQuality | None = None) -> QualityEstimate:
    """KLD estimate for ``weights`` x ``kv`` at ``ctx`` tokens of context."""
    key = measured_key(model, weights, kv)
    if measured and key in measured:
        return QualityEstimate(float(measured[key]), MEASURED, None, None,
                               (f"measured by wkvlab for {key[0]} x {key[1]}",))
    table = priors()
    w = _weight_entry(table, weights.format)
    kept = 1.0 - len(weights.skip_layers) / model.num_layers  # 16-bit layers add no error
    w_kld = w["kld"] * kept
    kv_kld, kv_bases, kv_sources = _kv_prior(model, kv, ctx, table)
    bases = {w["basis"], *kv_bases}
    source = PRIOR_LITERATURE if bases == {"literature"} else PRIOR_EXTRAPOLATED
    detail = (f"weights {weights}: {w['source']}",) + tuple(f"KV {s}" for s in kv_sources)
    return QualityEstimate(w_kld + kv_kld, source, w_kld, kv_kld, detail)


def measured_key(model: ModelDescription, weights: WeightSpec, kv: KVLayout) -> tuple[str, str]:
    """The key a measured result is stored under: canonical strings, 16-bit caches named after
    the model dtype (wkvlab calls its unquantized cache ``fp16`` whatever the dtype)."""
    return str(weights), str(with_16bit_as(kv, model.dtype))


def _weight_entry(table: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    if name in table["weights"]:
        return table["weights"][name]
    # General int<b>[-g<G>]...: borrow the closest named prior by bit width.
    bits = int(name[3]) if name.startswith("int") and name[3:4].isdigit() else 4
    base = "int8" if bits >= 8 else "int4-g128"
    entry = dict(table["weights"][base])
    entry["kld"] = entry["kld"] * (4 ** max(0, 4 - bits) if bits < 8 else 1)
    entry["basis"] = "extrapolated"
    entry["source"] = f"{base} prior, x4 per bit below 4 (error power), for {name}"
    return entry


def _kv_prior(model: ModelDescription, kv: KVLayout, ctx: int,
              table: Mapping[str, Any]) -> tuple[float, set[str], list[str]]:
    layers = model.kv_layers
    if not layers:
        return 0.0, {"literature"}, []
    bases: set[str] = set()
    sources: dict[str, str] = {}
    total = 0.0
    for layer in layers:
        pair = kv.pair_for(model, layer)
        total += _pair_prior(pair, ctx, table, bases, sources)
    return total / len(layers), bases, [f"{k}: {v}" for k, v in sources.items()]


def _pair_prior(pair: KVPair, ctx: int, table: Mapping[str, Any], bases: set[str],
                sources: dict[str, str]) -> float:
    def one(name: str) -> float:
        entry = table["kv"].get(name)
        if entry is None:  # general int<b>-g<G>: the per-token-head prior of the same width
            base = f"int{kv_format(name).bits}"
            entry = dict(table["kv"].get(base, table["kv"]["int4"]), basis="extrapolated",
                         source=f"{base} prior used for {name}")
        bases.add(entry["basis"])
        sources[name] = entry["source"]
        growth = table["context_growth"]
        factor = 1.0
        if kv_format(name).bits < growth["below_bits"] and ctx > growth["reference_ctx"]:
            factor += growth["growth_per_doubling"] * math.log2(ctx / growth["reference_ctx"])
        return float(entry["kld"]) * factor

    if pair.k == pair.v:
        return one(pair.k)
    return max(one(pair.k), table["v_only_factor"] * one(pair.v))
