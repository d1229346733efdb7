"""How much memory ``wkvlab profile`` and ``wkvlab search`` need, before anything loads (issue 40).

They run no evaluation grid, so :func:`wkvlab.eval.memory.estimate_memory` does not describe them;
this module counts, with the same parts and byte rules, what :mod:`wkvlab.search.profile`,
:mod:`wkvlab.search.measure` and :func:`wkvlab.search.api.search_windows` hold at once:

* the reference model, and — for a weight config other than ``none`` — its quantized copy
  (``quantize_model_weights`` returns a copy); a weight profile adds :class:`WeightSwap`'s copy of
  the reference, alive while the per-layer and per-module weight scores run;
* :class:`~wkvlab.search.measure.Scorer`'s kept reference log-probabilities (float32, every scored
  token × the vocabulary) when they fit ``REFERENCE_CACHE_BYTES``; otherwise the reference's pass
  runs beside each candidate's (a second cache);
* per scored chunk, as in an evaluation: the caches of the passes side by side, the chunk's float32
  logits and what the KLD derives from them, one chunk's activations;
* the profile's sink and outlier statistics: one uncached forward over a whole window (its logits,
  its activations) and one layer's float32 attention scores, probabilities and causal masks;
* a search: the weight-aware profile, then the 16-bit-weight profile (the reference alone), then
  the held-out evaluation — the quantized copy, a second copy with some layers kept 16-bit
  (``--joint-weights``, one at a time) and the held-out windows' kept log-probabilities.

The peak is the largest of these phases, or a calibrated build's (the weights, the copy being
built and what the calibration holds, as for a grid). This module imports no torch.
"""
from __future__ import annotations

from wkvlab.eval.memory import (DTYPE_BYTES, HEAD_BLOCK_BYTES, LIVE_LOGITS, GridShape, MemoryEstimate, Part, PlanEstimate,
                                _activations, _cache_bytes, _calibration, _fixed_parts, auto_chunk)
from wkvlab.kv.spec import KVSpec
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import parameter_count
from wkvlab.weights.spec import WeightSpec

REFERENCE_CACHE_BYTES = 1 << 30  # the reference's kept log-probs (float32) across all windows (wkvlab.search.measure)


def scored_tokens(ctx: int, tokens: int) -> int:
    """Scored tokens of ``tokens`` cut into windows of ``ctx`` (wkvlab.data.make_windows: at least one window, every position but the last)."""
    return max(1, tokens // ctx) * (ctx - 1)


def kept_reference_bytes(vocab: int, scored: int) -> int:
    """What :class:`~wkvlab.search.measure.Scorer` keeps of the reference: every scored token's float32 log-probabilities, if they fit."""
    need = scored * vocab * 4
    return need if need <= REFERENCE_CACHE_BYTES else 0


def _scoring(desc: ModelDescription, ctx: int, scored: int, d: int) -> list[Part]:
    """One scored chunk beside the kept reference: the caches (the reference's too while it is stepped), logits, activations."""
    chunk = auto_chunk(desc.vocab_size, ctx)
    kept = kept_reference_bytes(desc.vocab_size, scored)
    cache = _cache_bytes(desc, KVSpec.parse("fp16"), ctx, chunk, d)  # a simulated cache holds dequantized values: fp16's size
    return [Part("reference log-probs (kept)", kept),
            Part("KV caches (reference + candidate)", 2 * cache),
            Part("logits (one chunk, float32)", LIVE_LOGITS["copies"] * chunk * desc.vocab_size * 4),
            Part("activations (one chunk)", _activations(desc, chunk, ctx, d)),
            Part("float32 head block", min(HEAD_BLOCK_BYTES, desc.vocab_size * desc.hidden_size * 4) if d != 4 else 0)]


def _statistics(desc: ModelDescription, ctx: int, d: int) -> Part:
    """The sinks pass (wkvlab.search.profile.attention_statistics): a window without a cache, its
    logits for every position, and one layer's float32 scores, masked copy and probabilities."""
    window = ctx * desc.vocab_size * 4 + _activations(desc, ctx, ctx, d) + 3 * desc.num_heads * ctx * ctx * 4
    return Part("sink statistics (one window, uncached)", window)


def _profile_phases(desc: ModelDescription, weights: WeightSpec, ctx: int, tokens: int, d: int, weight_profile: bool) -> list[list[Part]]:
    model = parameter_count(desc) * d
    copy = [Part("quantized copy", model)] if not weights.is_identity else []
    scoring = _scoring(desc, ctx, scored_tokens(ctx, tokens), d)
    phases = [[Part("weights", model), *copy, *scoring]]
    if weight_profile and not weights.is_identity:
        phases.append([Part("weights", model), *copy, Part("weight-swap copy", model), *scoring])
    phases.append([Part("weights", model), *copy, scoring[0], _statistics(desc, ctx, d)])
    return phases


def _estimate(name: str, desc: ModelDescription, phases: list[list[Part]], weights: WeightSpec, grid: GridShape,
              calibration: tuple[int, int], budget: int | None) -> MemoryEstimate:
    fixed = _fixed_parts(desc, grid.device)
    d = DTYPE_BYTES[grid.dtype]
    worst = max(phases, key=lambda parts: sum(p.bytes for p in parts))
    build = ()
    if weights.needs_calibration:
        build = (Part("weights", parameter_count(desc) * d), Part("quantized copy", parameter_count(desc) * d),
                 Part("calibration capture", _calibration(desc, (weights,), *calibration, d)), *fixed)
    plan = PlanEstimate(name, 1, (*worst, *fixed), build)
    return MemoryEstimate(desc.name, grid, auto_chunk(desc.vocab_size, grid.ctx), (plan,), budget, plan)


def profile_estimate(desc: ModelDescription, weights: WeightSpec, *, ctx: int, tokens: int, dtype: str = "float32", device: str = "cpu",
                     weight_profile: bool = True, calibration: tuple[int, int] = (16, 512), budget: int | None = None) -> MemoryEstimate:
    """``wkvlab profile``'s peak: the largest phase of :func:`wkvlab.search.profile.collect_profile`."""
    d = DTYPE_BYTES[dtype]
    grid = GridShape((weights,), (KVSpec.parse("fp16"),), ctx=ctx, tokens=scored_tokens(ctx, tokens), dtype=dtype, device=device)
    return _estimate("profile", desc, _profile_phases(desc, weights, ctx, tokens, d, weight_profile), weights, grid, calibration, budget)


def search_estimate(desc: ModelDescription, weights: WeightSpec, *, ctx: int, profile_tokens: int, heldout_tokens: int,
                    dtype: str = "float32", device: str = "cpu", joint_weights: bool = False, calibration: tuple[int, int] = (16, 512),
                    budget: int | None = None) -> MemoryEstimate:
    """``wkvlab search``'s peak: its weight-aware profile (with the weight profile), the 16-bit-weight
    profile, or the held-out evaluation of every plan and rival, whichever holds most."""
    d = DTYPE_BYTES[dtype]
    model = parameter_count(desc) * d
    phases = _profile_phases(desc, weights, ctx, profile_tokens, d, weight_profile=True)
    heldout = [Part("weights", model)]
    if not weights.is_identity:
        heldout.append(Part("quantized copy", model))
        if joint_weights:
            heldout.append(Part("copy with 16-bit layers", model))
    phases.append([*heldout, *_scoring(desc, ctx, scored_tokens(ctx, heldout_tokens), d)])
    grid = GridShape((weights,), (KVSpec.parse("fp16"),), ctx=ctx, tokens=scored_tokens(ctx, heldout_tokens), dtype=dtype, device=device)
    return _estimate("search", desc, phases, weights, grid, calibration, budget)
