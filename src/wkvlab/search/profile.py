"""Per-layer sensitivity profiles: what each layer's K, V and weights cost, where sinks and outliers sit.

Every number is measured on the profiling windows as mean per-token KLD against the unquantized
reference (float32 weights, untouched cache), under the chosen weight config ``W``:

* ``base``: weights ``W``, cache untouched.
* ``k[f][l]`` / ``v[f][l]``: weights ``W``, only layer ``l``'s keys (values) stored in format ``f``.
  Their difference from ``base`` is that layer's K (V) sensitivity *given* the weight error — the
  weight-aware profile; with ``W = none`` it is the plain (KVTuner-style) profile.
* ``uniform["k/v"]``: every layer in the pair ``k/v`` — what the predictor's interaction correction
  is fitted to.
* ``weight_layers[l]``: cache untouched, only layer ``l``'s weights as ``W`` quantized them;
  ``weight_modules``: only one kind of projection (q/k/v/o, gate/up/down) in all layers, all
  attention projections, all MLP projections.
* ``sinks[l]``: attention mass on position 0, the positions that receive most attention from
  non-local queries, and tokens whose residual-stream peak exceeds 8x the median (KVSink's test);
  ``outliers[l]``: per-channel |K| and |V| maxima against their median channel.

The saved form is plain JSON (:meth:`SensitivityProfile.to_dict`), documented in docs/search.md,
so other tools (the HTML report) can chart it.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from wkvlab.runtime import input_device
from wkvlab.data.windows import WindowSet
from wkvlab.errors import ConfigError
from wkvlab.kv.override import attention_inputs, attention_override, model_head_dim
from wkvlab.kv.spec import AUTO_SINK_RATIO, KVSpec
from wkvlab.search.choices import Choice, single_formats
from wkvlab.search.measure import Score, Scorer, WeightSwap, layer_of
from wkvlab.specio import reject_unknown_fields
from wkvlab.weights.apply import quantize_with_progress
from wkvlab.weights.calibration import CalibrationSet
from wkvlab.weights.spec import WeightSpec

PROFILE_VERSION = 1
MODULE_GROUPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NON_LOCAL = 8  # a key counts as attracting attention only from queries at least this far after it
Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class SensitivityProfile:
    model: str
    data: str
    weights: str
    weights_spec: dict
    ctx: int
    tokens: int
    layers: int
    kv_heads: int
    head_dim: int
    base: dict
    k: dict
    v: dict
    uniform: dict
    weight_layers: list = field(default_factory=list)
    weight_modules: dict = field(default_factory=dict)
    sinks: list = field(default_factory=list)
    outliers: list = field(default_factory=list)
    fingerprints: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    version: int = PROFILE_VERSION

    @property
    def base_kld(self) -> float:
        return float(self.base["kld"])

    def k_delta(self, fmt: str) -> list[float]:
        """Per-layer KLD added by quantizing that layer's keys to ``fmt`` (0 for fp16)."""
        return self._delta(self.k, fmt, "K")

    def v_delta(self, fmt: str) -> list[float]:
        return self._delta(self.v, fmt, "V")

    def _delta(self, table: dict, fmt: str, side: str) -> list[float]:
        if fmt == "fp16":
            return [0.0] * self.layers
        if fmt not in table:
            raise ConfigError(f"the profile has no {side} measurements for {fmt}; profile again with this format in --formats")
        return [x - self.base_kld for x in table[fmt]]

    def weight_gain(self) -> list[float]:
        """Per-layer KLD of quantizing only that layer's weights (what keeping it at 16 bits would save)."""
        return [float(x) for x in self.weight_layers]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SensitivityProfile":
        reject_unknown_fields(cls, data, "sensitivity profile")
        if data.get("version") != PROFILE_VERSION:
            raise ConfigError(f"profile version {data.get('version')} is not {PROFILE_VERSION}; profile again")
        return cls(**data)

    def save(self, path: Path) -> None:
        from wkvlab.io import write_json_atomic

        write_json_atomic(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: Path) -> "SensitivityProfile":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"profile file not found: {path}; create it with wkvlab profile --json {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise ConfigError(f"{path} is not valid JSON; write it with wkvlab profile --json") from None
        return cls.from_dict(data)


def profile_steps(n_layers: int, choices: tuple[Choice, ...], weights: WeightSpec, weight_profile: bool) -> int:
    ks, vs = single_formats(choices)
    uniform = sum(1 for c in choices if c != ("fp16", "fp16"))
    weight = (n_layers + len(MODULE_GROUPS) + 2) if (weight_profile and not weights.is_identity) else 0
    return 2 + n_layers * (len(ks) + len(vs)) + uniform + weight + 1


def profile_key(fingerprints: dict, weights: WeightSpec, choices: tuple[Choice, ...], windows: WindowSet,
                weight_profile: bool, calibration: CalibrationSet | None) -> str:
    """Content address of a profile: model, text slice, weights, formats, calibration, version."""
    payload = {
        "version": PROFILE_VERSION,
        "fingerprints": fingerprints,
        "weights": {**weights.to_dict(), "label": None},
        "formats": [list(single_formats(choices)[0]), list(single_formats(choices)[1])],
        "uniform": sorted(f"{k}/{v}" for k, v in choices),
        "windows": hashlib.sha256(windows.tokens.numpy().tobytes()).hexdigest(),
        "score_from": windows.score_from,
        "weight_profile": weight_profile,
        "calibration": calibration.key if calibration is not None and weights.needs_calibration else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


@torch.no_grad()
def collect_profile(reference: torch.nn.Module, windows: WindowSet, weights: WeightSpec, choices: tuple[Choice, ...], *,
                    model_name: str, data_name: str, fingerprints: dict | None = None,
                    calibration: CalibrationSet | None = None, weight_profile: bool = True,
                    progress: Progress | None = None, scorer: Scorer | None = None) -> SensitivityProfile:
    tick = progress or (lambda _d, _n: None)
    start = time.perf_counter()
    cfg = reference.config.get_text_config()
    n_layers, head_dim = cfg.num_hidden_layers, model_head_dim(reference)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    for k, v in choices:
        KVSpec(k=k, v=v).check_model(head_dim, n_layers)
    qw = quantize_with_progress(reference, weights, calibration, (fingerprints or {}).get("model_sha256"), tick)
    scorer = scorer or Scorer(reference, windows)
    base = scorer.score(qw.model)
    tick("base", 1)
    ks, vs = single_formats(choices)
    tables: dict[str, dict[str, list[float]]] = {"k": {}, "v": {}}
    for side, formats in (("k", ks), ("v", vs)):
        for fmt in formats:
            row = []
            for layer in range(n_layers):
                pair = (layer, fmt, "fp16") if side == "k" else (layer, "fp16", fmt)
                row.append(scorer.score(qw.model, KVSpec(layers=(pair,))).kld)
                tick(f"{side.upper()} {fmt} layer {layer}", 1)
            tables[side][fmt] = row
    uniform = {}
    for k, v in choices:
        if (k, v) != ("fp16", "fp16"):
            uniform[f"{k}/{v}"] = scorer.score(qw.model, KVSpec(k=k, v=v)).kld
            tick(f"uniform {k}/{v}", 1)
    notes = list(qw.notes)
    weight_layers: list[float] = []
    weight_modules: dict[str, float] = {}
    if weight_profile and not weights.is_identity:
        weight_layers, weight_modules = _weight_profile(reference, qw.model, scorer, n_layers, tick)
        if weights.activations != "none":
            notes.append(f"per-layer weight profile swaps weights only; {weights.activations} activation quantization is not part of it")
    sinks, outliers = attention_statistics(qw.model, windows)
    tick("sinks and outlier channels", 1)
    return SensitivityProfile(
        model=model_name, data=data_name, weights=weights.label, weights_spec=weights.to_dict(), ctx=windows.ctx,
        tokens=base.tokens, layers=n_layers, kv_heads=int(kv_heads), head_dim=head_dim, base=base.to_dict(),
        k=tables["k"], v=tables["v"], uniform=uniform, weight_layers=weight_layers, weight_modules=weight_modules,
        sinks=sinks, outliers=outliers, fingerprints=dict(fingerprints or {}), notes=notes,
        seconds=round(time.perf_counter() - start, 1),
    )


def _weight_profile(reference, quantized, scorer: Scorer, n_layers: int, tick: Progress) -> tuple[list[float], dict[str, float]]:
    swap = WeightSwap(reference, quantized)
    per_layer = []
    for layer in range(n_layers):
        with swap.only(lambda n, l=layer: layer_of(n) == l) as model:
            per_layer.append(scorer.score(model).kld)
        tick(f"weights of layer {layer} only", 1)
    modules: dict[str, float] = {}
    groups = [(g, f".{g}.") for g in MODULE_GROUPS] + [("attention (q,k,v,o)", ".self_attn."), ("mlp", ".mlp.")]
    for label, needle in groups:
        with swap.only(lambda n, s=needle: s in n) as model:
            modules[label] = scorer.score(model).kld
        tick(f"weights of {label} only", 1)
    return per_layer, modules


@torch.no_grad()
def attention_statistics(model: torch.nn.Module, windows: WindowSet) -> tuple[list[dict], list[dict]]:
    """Per layer: sink evidence (attention mass, residual-stream peaks) and K/V outlier channels."""
    acc: dict[int, dict] = {}
    with attention_inputs(model) as inputs:

        def record(backend, module, query, key, value, attention_mask, **kwargs):
            layer = module.layer_idx
            entry = acc.setdefault(layer, {"first": [], "received": [], "peaks": [], "k": None, "v": None})
            q, k = query[0].float(), key[0].float()
            k_full = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
            scores = (q @ k_full.transpose(-1, -2)) * (kwargs.get("scaling") or module.scaling)
            t = scores.shape[-1]
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            probs = scores.masked_fill(~causal, float("-inf")).softmax(-1).mean(0)  # [queries, keys]
            entry["first"].append(float(probs[:, 0].mean()))
            far = torch.ones(t, t, dtype=torch.bool).tril(-NON_LOCAL)
            counts = far.sum(0).clamp(min=1)
            entry["received"].append((probs * far).sum(0) / counts)
            residual = inputs.get(layer, {}).get("residual")
            if residual is not None:
                entry["peaks"].append(residual[0].float().abs().amax(-1))
            for name, x in (("k", key), ("v", value)):
                amax = x[0].float().abs().amax(1)  # [kv_heads, head_dim]
                entry[name] = amax if entry[name] is None else torch.maximum(entry[name], amax)
            return backend(module, query, key, value, attention_mask, **kwargs)

        with attention_override(model, record):
            for tokens in windows.tokens:
                model(input_ids=tokens[None].to(input_device(model)), use_cache=False)
    sinks, outliers = [], []
    for layer in sorted(acc):
        entry = acc[layer]
        received = torch.stack(entry["received"]).mean(0)
        valid = received[: max(1, received.numel() - NON_LOCAL)]
        top = torch.topk(valid, min(3, valid.numel()))
        peaks = torch.stack(entry["peaks"]) if entry["peaks"] else None
        ratio = (peaks / peaks.median().clamp(min=1e-12)) if peaks is not None else None
        hot = sorted({int(p) for p in torch.nonzero(ratio > AUTO_SINK_RATIO)[:, 1].tolist()}) if ratio is not None else []
        sinks.append({
            "layer": layer,
            "attention_to_first": round(sum(entry["first"]) / len(entry["first"]), 5),
            "top_positions": [int(i) for i in top.indices.tolist()],
            "top_mass": [round(float(x), 5) for x in top.values.tolist()],
            "activation_sink_positions": hot[:16],
            "max_peak_ratio": round(float(ratio.max()), 2) if ratio is not None else None,
        })
        outliers.append({"layer": layer, **_channel_stats(entry["k"], "k"), **_channel_stats(entry["v"], "v")})
    return sinks, outliers


def _channel_stats(amax: torch.Tensor, side: str) -> dict:
    flat = amax.flatten()
    median = float(flat.median().clamp(min=1e-12))
    top = torch.topk(flat, min(4, flat.numel()))
    head_dim = amax.shape[-1]
    return {
        f"{side}_max_over_median": round(float(flat.max()) / median, 2),
        f"{side}_top_channels": [f"h{int(i) // head_dim}:c{int(i) % head_dim}" for i in top.indices.tolist()],
    }


__all__ = ["SensitivityProfile", "Score", "collect_profile", "profile_key", "profile_steps", "attention_statistics"]
