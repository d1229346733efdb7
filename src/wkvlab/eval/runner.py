"""Run the reference once and every (weights × KV) candidate against it, window by window.

Loop order: windows outside, configurations inside. The reference distribution of a window is
computed once, compared with every candidate, and dropped — the full-vocabulary reference never
has to be stored (8k tokens × 49k vocabulary would be 1.6 GB in float32, 8.6 GB for Gemma's 262k).
The price is that every weight-quantized copy stays in memory for the whole run; each is built
once and shared by all its KV configs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline
from wkvlab.eval.metrics import ReferenceTokens, TokenMetrics, compare_tokens, position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.errors import ConfigError
from wkvlab.kv.calibrate import KVStats, cached_kv_stats
from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.override import model_head_dim, sliding_layers
from wkvlab.kv.presets import fidelity_note, fidelity_of
from wkvlab.kv.spec import KVSpec
from wkvlab.runtime import keep_freed_memory
from wkvlab.weights.apply import QuantizedWeights, quantize_model_weights
from wkvlab.weights.calibration import CalibrationSet
from wkvlab.weights.spec import WeightSpec

Progress = Callable[[str, int], None]  # (description of the step just done, steps advanced)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    sliding: tuple[bool, ...]

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        cfg = model.config
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, kv_heads, model_head_dim(model), sliding_layers(model))

    def kv_bytes_per_token(self, spec: KVSpec, context: int | None = None) -> float:
        return spec.bytes_per_token(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim, sliding=self.sliding, context=context)


@torch.no_grad()
def forward_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[ctx, vocab]`` of one window, without building a KV cache object."""
    return model(input_ids=tokens[None], use_cache=False).logits[0]


def check_kv_specs(model: torch.nn.Module, kv_specs: list[KVSpec]) -> None:
    """Fail before any work on a format the model's head_dim cannot hold."""
    head_dim = model_head_dim(model)
    for kv in kv_specs:
        kv.check_model(head_dim, model.config.num_hidden_layers)


def grid_steps(windows: WindowSet, n_weights: int, n_kv: int, kv_calibration: bool = False) -> int:
    return n_weights * (2 if kv_calibration else 1) + windows.n_windows * (1 + n_weights * n_kv)


@torch.no_grad()
def run_grid(
    model: torch.nn.Module,
    windows: WindowSet,
    weight_specs: list[WeightSpec],
    kv_specs: list[KVSpec],
    *,
    model_name: str,
    data_name: str,
    fingerprints: dict[str, str] | None = None,
    progress: Progress | None = None,
    calibration: CalibrationSet | None = None,
    baseline: Baseline = FLOAT_BASELINE,
    notes: list[str] | None = None,
) -> list[EvalResult]:
    """Evaluate every weights × KV combination on the same windows; results in grid order.

    ``calibration`` feeds the weight configs that need it (GPTQ, AWQ, SmoothQuant, static
    activation scales); each is calibrated once here and shared by all its KV configs.
    ``baseline`` (:mod:`wkvlab.eval.baseline`) is attached around the reference pass and every
    candidate pass alike; ``notes`` are added to every result (the baseline's choice).
    """
    tick = progress or (lambda _desc, _n: None)
    keep_freed_memory()
    shape = ModelShape.of(model)
    check_kv_specs(model, kv_specs)
    built: list[QuantizedWeights] = []
    build_seconds: list[float] = []
    for spec in weight_specs:
        start = time.perf_counter()
        built.append(quantize_model_weights(model, spec, calibration, model_key=(fingerprints or {}).get("model_sha256")))
        build_seconds.append(time.perf_counter() - start)
        tick(f"quantized weights {spec.label}", 1)

    kv_stats: list[KVStats | None] = [None] * len(built)
    if any(kv.needs_calibration for kv in kv_specs):
        if calibration is None:
            raise ConfigError("a KV config needs calibration but no calibration text was prepared; pass calibration= (wkvlab eval does)")
        for wi, qw in enumerate(built):
            # K/V statistics under this weight config: quantized weights change the keys they produce
            key = f"{(fingerprints or {}).get('model_sha256', model_name)}|{json.dumps(qw.spec.to_dict(), sort_keys=True)}|{calibration.key}"
            kv_stats[wi] = cached_kv_stats(qw.model, calibration.tokens, key, {"calibration": calibration.spec.label})
            tick(f"calibrated KV statistics under {qw.spec.label}", 1)

    cells = [(wi, kv) for wi in range(len(built)) for kv in kv_specs]
    # per-layer stores built once per cell and reused by every window
    cell_stores = [layer_stores(built[wi].model, kv, kv_stats[wi] if kv.needs_calibration else None) for wi, kv in cells]
    parts: list[list[TokenMetrics]] = [[] for _ in cells]
    seconds = [0.0] * len(cells)
    lo, hi = windows.score_from, windows.ctx - 1
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        with baseline.attached(model):
            ref = ReferenceTokens.from_logits(forward_logits(model, tokens)[lo:hi], tokens[lo + 1 : hi + 1])
        tick("reference", 1)
        for c, (wi, kv) in enumerate(cells):
            start = time.perf_counter()
            with baseline.attached(built[wi].model), kv_quantization(built[wi].model, kv, stores=cell_stores[c]):
                logits = forward_logits(built[wi].model, tokens)[lo:hi]
            parts[c].append(compare_tokens(ref, logits))
            seconds[c] += time.perf_counter() - start
            tick(f"{built[wi].spec.label} × {kv.label}", 1)
        del ref

    positions = np.arange(lo, hi)
    buckets = position_buckets(windows.ctx)
    results = []
    for c, (wi, kv) in enumerate(cells):
        qw = built[wi]
        results.append(EvalResult(
            model=model_name,
            data=data_name,
            ctx=windows.ctx,
            weights=qw.spec.label,
            kv=kv.label,
            weights_spec=qw.spec.to_dict(),
            kv_spec=kv.to_dict(),
            weight_bytes=qw.weight_bytes,
            # sinks and residual windows held at 16 bits are amortized over the evaluated context
            kv_bytes_per_token=shape.kv_bytes_per_token(kv, context=windows.ctx),
            seconds=seconds[c] + build_seconds[wi] / len(kv_specs),
            arrays=TokenArrays.concat(parts[c], positions),
            buckets=buckets,
            fingerprints=dict(fingerprints or {}),
            notes=list(qw.notes) + list(notes or ()) + fidelity_note(kv),
            fidelity={**fidelity_of(kv), "baseline": baseline.to_dict()},
        ))
    return results
