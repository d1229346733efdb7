"""``plan()``: every weight x KV combination for a model, GPU, batch and context — bytes, fit,
speed, quality, engine support — ranked, with launch lines for the best ones.

Ranking (the seed studies' rules, in order):

1. FP8 weights only where the GPU has FP8 tensor cores; elsewhere they rank last (they still
   save memory, but run as W8A16 and gain no FP8 GEMM). Next-to-last: combinations the engine
   accepts but runs on a silent slow path (llama.cpp attention on the CPU, bitsandbytes).
2. KV below 8 bits ranks after every fitting combination with an 8-bit-or-wider cache unless
   wkvlab has measured that combination: lower the weights before the KV cache, and stop KV at
   8 bits — its penalty grows with context and W4 x KV4 can collapse (seeds 000, 002).
3. Quality tier of the weights' KLD (the whole combination's when measured): <= 0.005
   (near-lossless, FP8 W8A8 class), <= 0.02 (4-bit weight class), above. 8-bit KV adds
   < 0.001 (seed 002: "essentially free"), so it does not move a combination between tiers.
4. Within a tier, decode tokens/s (estimate) at the requested batch — but speeds within 5% of
   the fastest remaining one count as a tie (a roofline cannot resolve less), broken by the
   lower total KLD.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from wkvlab import __version__
from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.engines import (COMMAND_ENGINES, ENGINES, LaunchCommand, Support, check_support,
                                 launch_command, normalize_engine)
from wkvlab.plan.gpus import GPU, find_gpu, load_gpu_catalog
from wkvlab.plan.kv import KVBytes, KVLayout, kv_bytes_per_token, parse_kv
from wkvlab.plan.memory import EngineSettings, FitResult, MemoryBudget, fit, memory_budget
from wkvlab.plan.models import ModelDescription, resolve_model
from wkvlab.plan.quality import (MEASURED, MeasuredQuality, QualityEstimate, estimate_quality,
                                 measured_key)
from wkvlab.plan.throughput import RooflineAssumptions, ThroughputEstimate, estimate_throughput
from wkvlab.plan.weights import (WeightBytes, WeightSpec, parse_weight_spec, weight_bytes,
                                 weight_format)

QUALITY_TIERS = (0.005, 0.02)
SPEED_TIE = 0.05  # relative decode-speed difference the roofline estimate cannot resolve


@dataclass(frozen=True)
class EngineEvaluation(JsonMixin):
    """One engine's view of a combination: support, its memory rule, fit and launch line."""

    engine: str
    support: Support
    budget: MemoryBudget
    kv_per_token_bytes: int
    fit: FitResult
    command: LaunchCommand | None = None


@dataclass(frozen=True)
class Combination(JsonMixin):
    weights: str
    kv: str
    engine: str  # engine whose rule the headline numbers use ("none" if no engine accepts)
    weight_bytes: WeightBytes
    kv_bytes: KVBytes
    fit: FitResult
    budget: MemoryBudget
    throughput: ThroughputEstimate
    quality: QualityEstimate
    evaluations: tuple[EngineEvaluation, ...]
    rank: int | None = None  # 1 = best; None = does not fit or no engine accepts it
    ranking_notes: tuple[str, ...] = ()

    @property
    def engines_accepting(self) -> tuple[str, ...]:
        return tuple(e.engine for e in self.evaluations if e.support.accepted)

    @property
    def fits(self) -> bool:
        return self.engine != "none" and self.fit.fits


@dataclass(frozen=True)
class Recommendation(JsonMixin):
    engine: str
    weights: str
    kv: str
    command: LaunchCommand
    why: tuple[str, ...]


@dataclass(frozen=True)
class PlanResult(JsonMixin):
    model: ModelDescription
    gpu: GPU
    batch: int
    ctx: int
    engine: str | None
    rows: tuple[Combination, ...]  # ranked rows first, then the rest in grid order
    recommendations: tuple[Recommendation, ...]
    notes: tuple[str, ...]
    settings: EngineSettings
    assumptions: RooflineAssumptions
    wkvlab_version: str = __version__
    label: str = "planning estimate: exact bytes, estimated reserves/speed, prior quality unless measured"
    warnings: tuple[str, ...] = field(default=())


def default_grid(model: ModelDescription, gpu: GPU, engine: str | None,
                 weights: list[str] | None, kv: list[str] | None) -> tuple[list[tuple[str, str]], list[str]]:
    """(weights, kv) pairs to evaluate, and notes on substitutions made."""
    notes: list[str] = []
    d = model.dtype
    fp8_kv = "fp8_e4m3" if gpu.sm >= 89 else "fp8_e5m2"
    if gpu.sm < 89:
        notes.append(f"{gpu.name} (sm_{gpu.sm}) has no FP8 tensor cores: the default grid uses "
                     "fp8_e5m2 KV (E4M3 KV needs sm_89+ in vLLM/SGLang's Triton kernels, vllm#26431)")
    served_w = [d, "fp8", "w8a8-int8", "int4-g128"]
    served_kv = [d, fp8_kv, "int8", "int4"]
    gguf_w, gguf_kv = ["q8_0", "q4_0"], [d, "q8_0", "q4_0"]
    if engine == "llama.cpp":
        served_w, served_kv, gguf_w = [], [], [d, "q8_0", "q4_0"]
    elif engine == "sglang":
        served_kv, gguf_w = [d, fp8_kv], []
    elif engine in ("vllm", "trtllm"):
        gguf_w = []
        if engine == "trtllm":
            served_kv = [d, "fp8_e4m3", "int8"] if gpu.sm >= 89 else [d, "int8"]
    if weights and kv:
        return [(w, k) for w in weights for k in kv], notes
    if weights:
        # Pair each given weight format with the KV dtypes of the engines that load it.
        pairs = [(w, k) for w in weights
                 for k in (gguf_kv if _is_gguf(w) or engine == "llama.cpp" else served_kv or gguf_kv)]
        return list(dict.fromkeys(pairs)), notes
    if kv:
        pairs = [(w, k) for k in kv
                 for w in (gguf_w if _llamacpp_only_kv(k) else (served_w or gguf_w))]
        return list(dict.fromkeys(pairs)), notes
    pairs = [(w, k) for w in served_w for k in served_kv]
    pairs += [(w, k) for w in gguf_w for k in gguf_kv]
    return list(dict.fromkeys(pairs)), notes


def _is_gguf(weights: str) -> bool:
    return weight_format(parse_weight_spec(weights).format).gguf


def _llamacpp_only_kv(kv: str) -> bool:
    layout = parse_kv(kv)
    return layout.is_mixed or any(f.startswith(("q", "iq")) for f in layout.formats())


def plan(model: str | Path | ModelDescription, gpu: str | GPU, batch: int, ctx: int,
         weights: Iterable[str] | None = None, kv: Iterable[str] | None = None,
         engine: str | None = None, measured_quality: MeasuredQuality | None = None,
         gpu_file: str | Path | None = None, settings: EngineSettings = EngineSettings(),
         assumptions: RooflineAssumptions = RooflineAssumptions()) -> PlanResult:
    """Evaluate and rank weight x KV combinations (see the module docstring for the rules)."""
    desc = resolve_model(model)
    device = find_gpu(gpu, load_gpu_catalog(gpu_file)) if not isinstance(gpu, GPU) else gpu
    if batch < 1 or ctx < 1:
        raise ConfigError(f"batch and ctx must be at least 1 (got batch={batch}, ctx={ctx})")
    if ctx > desc.max_position_embeddings:
        raise ConfigError(f"ctx {ctx} exceeds {desc.name}'s max_position_embeddings "
                          f"{desc.max_position_embeddings}; lower --ctx")
    eng = normalize_engine(engine)
    pairs, notes = default_grid(desc, device, eng, list(weights) if weights else None,
                                list(kv) if kv else None)
    measured = _normalize_measured(desc, measured_quality)
    engines = (eng,) if eng else ENGINES
    rows = [_evaluate(desc, device, parse_weight_spec(w), parse_kv(k, desc.dtype), batch, ctx,
                      engines, measured, settings, assumptions)
            for w, k in pairs]
    ranked = _rank(rows, device, ctx)
    recs = _recommend(ranked, desc, device, batch, ctx, eng, settings)
    notes += ["GB = 10^9 bytes, GiB = 2^30 bytes; bytes are exact, reserves and speeds are estimates",
              "quality = mean KLD vs bf16 (nats/token); 'prior' values come from the literature "
              "(data/quality_priors.yaml), not from this model"]
    warnings = []
    if eng == "trtllm":
        notes.append("TensorRT-LLM: support and memory only, no launch line is written "
                     "(set KvCacheConfig.dtype and the quantization in its LLM API options)")
    if not any(r.fits for r in ranked):
        warnings.append(f"nothing fits {desc.name} at batch {batch} x ctx {ctx} on one {device.name}; "
                        "lower batch or ctx, or use more GPUs (tensor parallelism is not modelled)")
    return PlanResult(desc, device, batch, ctx, eng, tuple(ranked), tuple(recs), tuple(notes),
                      settings, assumptions, warnings=tuple(warnings))


def _normalize_measured(model: ModelDescription, measured: MeasuredQuality | None) -> dict[tuple[str, str], float]:
    if not measured:
        return {}
    return {measured_key(model, parse_weight_spec(w), parse_kv(k, model.dtype)): float(v)
            for (w, k), v in measured.items()}


def _evaluate(model: ModelDescription, gpu: GPU, w: WeightSpec, kv: KVLayout, batch: int, ctx: int,
              engines: tuple[str, ...], measured: MeasuredQuality, settings: EngineSettings,
              assumptions: RooflineAssumptions) -> Combination:
    wb = weight_bytes(model, w)
    evaluations: list[EngineEvaluation] = []
    for engine in engines:
        support = check_support(engine, model, w, kv, gpu)
        per_token = kv_bytes_per_token(model, kv, support.row_scale_bytes)
        budget = memory_budget(engine, model, gpu, wb.total_bytes, settings)
        result = fit(budget, per_token, model, batch, ctx, settings)
        command = None
        if support.accepted and result.fits and engine in COMMAND_ENGINES:
            command = launch_command(engine, model, w, kv, gpu, batch, ctx, settings)
        evaluations.append(EngineEvaluation(engine, support, budget, per_token.total_bytes, result, command))
    accepted = [e for e in evaluations if e.support.accepted]
    if accepted:
        head = next((e for e in accepted if e.fit.fits), accepted[0])
        primary, per_token = head.engine, kv_bytes_per_token(model, kv, head.support.row_scale_bytes)
        budget, result = head.budget, head.fit
    else:
        primary, per_token = "none", kv_bytes_per_token(model, kv)
        budget = memory_budget(None, model, gpu, wb.total_bytes, settings)
        result = fit(budget, per_token, model, batch, ctx, settings)
    speed = estimate_throughput(model, gpu, wb, per_token, batch, ctx, assumptions)
    quality = estimate_quality(model, w, kv, ctx, measured)
    return Combination(str(w), str(kv), primary, wb, per_token, result, budget, speed, quality,
                       tuple(evaluations))


def _rank_key(row: Combination, gpu: GPU) -> tuple[int, int, int, int, float, float]:
    fmt = weight_format(parse_weight_spec(row.weights).format)
    fp8_elsewhere = int(fmt.compute == "fp8" and not gpu.has_native("fp8"))
    slow = int(any(e.support.slow_path for e in row.evaluations if e.engine == row.engine))
    low_kv = int(parse_kv(row.kv).min_bits() < 8 and row.quality.source != MEASURED)
    anchor = row.quality.weights_kld if row.quality.weights_kld is not None else row.quality.kld
    tier = sum(anchor > t for t in QUALITY_TIERS)
    return fp8_elsewhere, slow, low_kv, tier, -row.throughput.decode.tokens_per_s, row.quality.kld


def _order(rows: list[Combination], gpu: GPU) -> list[Combination]:
    """Sort by the rank key; within a group, near-equal speeds yield to lower KLD."""
    remaining = sorted(rows, key=lambda r: _rank_key(r, gpu))
    out: list[Combination] = []
    while remaining:
        group = _rank_key(remaining[0], gpu)[:4]
        fastest = remaining[0].throughput.decode.tokens_per_s
        close = [r for r in remaining if _rank_key(r, gpu)[:4] == group
                 and r.throughput.decode.tokens_per_s >= (1 - SPEED_TIE) * fastest]
        pick = min(close, key=lambda r: r.quality.kld)
        out.append(pick)
        remaining.remove(pick)
    return out


def _rank(rows: list[Combination], gpu: GPU, ctx: int) -> list[Combination]:
    fitting = _order([r for r in rows if r.fits], gpu)
    out = []
    for i, row in enumerate(fitting, 1):
        fp8_elsewhere, slow, low_kv, tier, _, _ = _rank_key(row, gpu)
        why = []
        if fp8_elsewhere:
            why.append(f"FP8 weights on {gpu.name}: no FP8 tensor cores, ranked last")
        if slow:
            why.append(f"{row.engine} takes a silent slow path here (see warnings): ranked after fast paths")
        if low_kv:
            why.append("KV below 8 bits: ranked after 8-bit caches until measured"
                       + (" (long context: its penalty grows with context)" if ctx >= 16384 else ""))
        bound = f"<= {QUALITY_TIERS[tier]}" if tier < len(QUALITY_TIERS) else f"> {QUALITY_TIERS[-1]}"
        why.append(f"quality tier {tier + 1} of {len(QUALITY_TIERS) + 1} (weights KLD {bound})")
        out.append(replace(row, rank=i, ranking_notes=tuple(why)))
    return out + [r for r in rows if not r.fits]


def _recommend(rows: list[Combination], model: ModelDescription, gpu: GPU, batch: int, ctx: int,
               engine: str | None, settings: EngineSettings) -> list[Recommendation]:
    recs = []
    for name in ((engine,) if engine else COMMAND_ENGINES):
        for row in rows:
            if row.rank is None:
                continue
            ev = next((e for e in row.evaluations if e.engine == name), None)
            if ev is None or ev.command is None:
                continue
            why = (f"rank {row.rank} among {sum(r.rank is not None for r in rows)} fitting combinations",
                   f"{row.weights} weights {row.weight_bytes.gb:.1f} GB + {row.kv} KV "
                   f"{ev.fit.kv_needed_bytes / 1e9:.1f} GB fit the {ev.budget.kv_pool_bytes / 1e9:.1f} GB "
                   f"KV pool; up to {ev.fit.max_batch} sequences at {ctx} tokens",
                   f"decode ~{row.throughput.decode.tokens_per_s:.0f} tok/s at batch {batch} "
                   f"({row.throughput.decode.bound}-bound, estimate)",
                   f"quality KLD ~{row.quality.kld:.4f} ({row.quality.source})",
                   *row.ranking_notes, *ev.support.warnings)
            recs.append(Recommendation(name, row.weights, row.kv, ev.command, why))
            break
    return recs
