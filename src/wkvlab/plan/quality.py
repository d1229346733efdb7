"""Predicted quality of a weight x KV combination: the user's measurement, a transfer, or a prior.

The unit is the mean KL divergence to the 16-bit model (nats/token), the metric wkvlab measures.
Order of evidence: a measurement of this model (:mod:`.measured`, labelled "measured (N tokens,
ctx C, text)"), then one of a smaller model of the same family ("transfer from ..."), then a
prior from ``data/quality_priors.yaml`` — every prior names its source (a paper, a table, a URL)
and the model it was measured on, and is ``prior (literature)`` when every part is a published KLD,
``prior (extrapolated)`` when a stated rule derived it. Priors combine additively (weights + KV);
a mixed K/V pair costs max(k_share x prior(K), v_share x prior(V)) (llama.cpp PR #7412).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from wkvlab.kv.spec import KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.guard import UNMEASURED, risky_keys, unsafe_reason
from wkvlab.plan.measured import MeasuredQuality, UnitValues, spec_key
from wkvlab.plan.models import SLIDING, ModelDescription
from wkvlab.plan.weights import as_weight_spec
from wkvlab.weights.spec import WeightSpec

MEASURED = "measured"
TRANSFER = "transfer"
PRIOR_LITERATURE = "prior (literature)"
PRIOR_EXTRAPOLATED = "prior (extrapolated)"


@dataclass(frozen=True)
class QualityEstimate(JsonMixin):
    kld: float
    source: str  # measured | transfer | prior (literature) | prior (extrapolated)
    label: str  # with its evidence: "measured (4,088 tokens, ctx 512, default)", "prior (extrapolated)"
    se: float  # standard error of a measurement (0 for a prior)
    weights_kld: float | None
    kv_kld: float | None
    detail: tuple[str, ...]  # where each number comes from
    top1: float | None = None  # measured top-1 agreement with the 16-bit model
    low: float | None = None  # 95% interval of a measured KLD (paired bootstrap over windows)
    high: float | None = None
    unsafe: str = ""  # why the guard drops it (plan/guard.py): never ranked, never recommended
    caution: str = ""  # guard.UNMEASURED on every prior (with the risky key format named where there is one)
    exact: bool = False  # the checkpoint itself (16-bit x 16-bit, or a quantized file as it is): KLD 0 by definition
    units: UnitValues | None = None  # a measurement's per-unit values (plan --tolerance decides on them)

    @property
    def is_measured(self) -> bool:
        return self.source in (MEASURED, TRANSFER)

    @property
    def interval(self) -> str:
        """'[low, high]' of a measured KLD, '' when it has none."""
        return "" if self.low is None or self.high is None else f"[{self.low:.4f}, {self.high:.4f}]"

    @property
    def shown(self) -> str:
        """The table's quality cell: the evidence, its interval, and the guard's word."""
        text = self.label if self.is_measured or self.exact else self.source
        text += f" {self.interval}" if self.interval else ""
        if self.unsafe:
            return f"UNSAFE ({self.unsafe}); {text}"
        return f"{text}; {self.caution}" if self.caution else text


@lru_cache(maxsize=1)
def priors() -> dict[str, Any]:
    text = resources.files("wkvlab.plan").joinpath("data/quality_priors.yaml").read_text()
    return yaml.safe_load(text)


@lru_cache(maxsize=1)
def _weight_keys() -> tuple[tuple[str, str], ...]:
    """(prior name, its canonical WeightSpec JSON): the table matched by configuration, not by string."""
    import json

    return tuple((name, json.dumps(_bare(WeightSpec.parse(name)).to_dict(), sort_keys=True)) for name in priors()["weights"])


def _bare(spec: WeightSpec) -> WeightSpec:
    return replace(spec, label="", skip_layers=(), skip_first=0, skip_last=0, skip_regex=None)


def _cite(entry: Mapping[str, Any]) -> str:
    source = priors()["sources"].get(entry["source"], entry["source"])
    rule = f"; rule: {entry['rule']}" if entry.get("rule") else ""
    return f"{entry['kld']:g} on {entry.get('model', '-')} — {source}{rule}"


def weight_prior(spec: WeightSpec) -> tuple[float, str, str]:
    """(KLD, basis, citation) for a weight spec; general int<b> formats borrow the nearest bit width."""
    import json

    table = priors()["weights"]
    wanted = json.dumps(_bare(spec).to_dict(), sort_keys=True)
    for name, key in _weight_keys():
        if key == wanted:
            entry = table[name]
            return float(entry["kld"]), entry["basis"], f"{name}: " + _cite(entry)
    if spec.method == "cast":
        return 0.0, "literature", "16-bit cast: the checkpoint itself"
    bits = spec.bits
    base = "q8_0" if bits >= 8 else "q5_1" if bits >= 5 else "q4_1"
    entry = table[base]
    factor = 4.0 ** max(0, 4 - bits)  # one bit fewer quadruples the rounding error power
    return float(entry["kld"]) * factor, "extrapolated", (f"{spec.label}: {base} prior x {factor:g} (4x per bit below 4: error power) — "
                                                          + _cite(entry))


def _kv_entry(name: str, scaled: bool, rotated: bool = False) -> tuple[float, str, str]:
    table = priors()["kv"]
    candidates = ([f"{name}+rot"] if rotated else []) + ([f"{name}+scales"] if scaled else []) + [name]
    key = next((c for c in candidates if c in table), name)
    if key in table:
        entry = table[key]
        return float(entry["kld"]), entry["basis"], f"{key}: " + _cite(entry)
    from wkvlab.kv.formats import get_kv_format

    bits = round(get_kv_format(name).bytes_per_vector(128) * 8 / 128)
    base = "int8" if bits >= 8 else "int4" if bits >= 4 else "int2"
    entry = table[base]
    return float(entry["kld"]), "extrapolated", f"{name}: the {base} prior (nearest bit width) — " + _cite(entry)


def kv_prior(model: ModelDescription, spec: KVSpec) -> tuple[float, set[str], list[str]]:
    """Mean prior over the cache-holding layers (each layer's own K/V formats)."""
    layers = model.kv_layers
    if not layers:
        return 0.0, {"literature"}, []
    table = priors()
    k_share, v_share = table["k_share"]["value"], table["v_share"]["value"]
    bases: set[str] = set()
    cites: dict[str, str] = {}
    total = 0.0
    scaled, rotated = spec.scales != "static", spec.rotate != 0
    for layer in layers:
        k, v = spec.formats_for(layer, model.layer_types[layer] == SLIDING)
        kk, kb, kc = _kv_entry(k.name, scaled, rotated)
        if k.name == v.name:
            total += kk
            bases.add(kb)
            cites[k.name] = kc
            continue
        vk, vb, vc = _kv_entry(v.name, scaled, rotated)
        total += max(k_share * kk, v_share * vk)
        bases |= {kb, vb, "extrapolated"}
        cites[k.name], cites[v.name] = kc, vc
    if any(getattr(spec, a) for a in ("sinks", "residual", "window", "smooth", "sink_ratio")) or (rotated and not any("+rot" in c for c in cites.values())):
        cites["options"] = "KV options (sinks, windows, smoothing, rotation of this format) are not in the priors: measure them"
        bases.add("extrapolated")
    return total / len(layers), bases, list(cites.values())


def estimate_quality(model: ModelDescription, weights: WeightSpec, kv: KVSpec,
                     measured: Mapping[tuple, MeasuredQuality] | None = None) -> QualityEstimate:
    """KLD of ``weights`` x ``kv`` on ``model``: measured when the user has it, else a prior; with the
    catastrophe guard's verdict (:mod:`.guard`)."""
    measured = measured or {}
    found = measured.get(spec_key(weights, kv))
    if found is not None:
        return QualityEstimate(found.kld, MEASURED if found.kind == "measured" else TRANSFER, found.label, found.se, None, None,
                               (f"{found.label}: {found.origin}",), found.top1, found.low, found.high,
                               unsafe=unsafe_reason(found.kld, found.top1), units=found.units)
    estimate = _prior(model, weights, kv)
    # a half measured on its own (the model's own weights with this cache, or these weights with the 16-bit cache)
    own = as_weight_spec("none", model)
    halves = [(f"KV {kv.label}", measured.get(spec_key(own, kv))), (f"weights {weights.label}", measured.get(spec_key(weights, KVSpec())))]
    for what, half in halves:
        if half is not None and unsafe_reason(half.kld, half.top1):
            return replace(estimate, unsafe=f"{what} alone: {unsafe_reason(half.kld, half.top1)} ({half.label})",
                           detail=estimate.detail + (f"{what} {half.label}: KLD {half.kld:.4f}",))
    if is_exact(weights, kv):
        return replace(estimate, exact=True, label="exact (the checkpoint itself)")
    risky = risky_keys(kv, model)
    kv_half = halves[0][1]
    if kv_half is not None:
        estimate = replace(estimate, detail=estimate.detail + (f"KV {kv.label} with the model's own weights {kv_half.label}: KLD {kv_half.kld:.4f}",))
    return replace(estimate, caution=UNMEASURED + (f" ({risky} keys per token)" if risky else ""))


def is_exact(weights: WeightSpec, kv: KVSpec) -> bool:
    """16-bit weights (the checkpoint cast, nothing skipped or overridden) with the 16-bit cache: no rounding to measure."""
    return weights.method in ("none", "cast") and not weights.overrides and kv.is_identity


def _prior(model: ModelDescription, weights: WeightSpec, kv: KVSpec) -> QualityEstimate:
    w_kld, w_basis, w_cite = weight_prior(weights)
    kept = 1.0 - len(weights.skip_layers) / model.num_layers  # 16-bit layers add no error
    kv_kld, kv_bases, kv_cites = kv_prior(model, kv)
    source = PRIOR_LITERATURE if {w_basis, *kv_bases} == {"literature"} else PRIOR_EXTRAPOLATED
    detail = (f"weights {w_cite}",) + tuple(f"KV {c}" for c in kv_cites) + (
        "weights + KV added: " + priors()["sources"][priors()["combination"]["source"]],)
    return QualityEstimate(w_kld * kept + kv_kld, source, source, 0.0, w_kld * kept, kv_kld, detail)
