"""``plan()``: every weight x KV combination for a model on one or more GPUs — bytes, fit, speed,
quality, engine support — ranked, with launch lines for the best ones.

What may be recommended is a verdict per configuration (:mod:`.verdict`, a pluggable rule; the
catastrophe guard today): the checkpoint itself (exact) and configurations measured on this model
that the rule allows. Priors and transfers are listed, ranked after them, and never recommended:
where an engine has nothing else, its best prior row gets a launch line labelled "unverified on
this model" and the command that measures it.

Ranking, in order:

1. FP8 weights only where the GPU has FP8 tensor cores (elsewhere last: they save memory but gain
   no FP8 GEMM); next-to-last, combinations an engine accepts but runs on a silent slow path.
2. Evidence: recommendable rows (exact, or measured on this model and allowed by the verdict) first,
   then the rest (transfers, priors).
3. Recommendable rows: when the exact checkpoint fits at the requested batch x context, memory is
   not the constraint and they are ordered by KLD alone (the most faithful first; a speed tie never
   trades a fitting config for a worse one). Otherwise by KLD; a faster config goes before the lowest
   KLD only when the one decision rule shows it equivalent within ±m (:func:`_shown_ties`: paired
   per-document KLD differences, m 10% of the lowest KLD, Holm over the configs compared) — a row
   without per-document values is never called a tie. Under a tolerance rule (``plan --tolerance``,
   every recommendable row shown within the user's tolerance) by memory at the requested batch x
   context instead, the smallest first, whether or not memory binds.
4. Among the rest: KV below 8 bits after every fitting 8-bit-or-wider cache (lower the weights
   before the KV: a prior says nothing about this model's cache at this depth); then the quality tier of the prior KLD
   (<= 0.005, <= 0.03, above); then decode tokens/s, speeds within 5% counting as a tie (a
   roofline cannot resolve less) broken by the lower KLD.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from wkvlab import __version__
from wkvlab.errors import ConfigError, WkvlabError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.engines import COMMAND_ENGINES, ENGINES, normalize_engine
from wkvlab.plan.evaluate import Context, EngineEvaluation, Layout, evaluate_engine, evaluate_speed
from wkvlab.plan.gpus import GPU, find_gpu, load_gpu_catalog
from wkvlab.plan.guard import thresholds
from wkvlab.plan.kv import KVBytes, as_kv_spec, kv_bytes_per_token, min_bits
from wkvlab.plan.launch import LaunchCommand
from wkvlab.plan.measured import Measurement, index_measurements, spec_key
from wkvlab.plan.memory import EngineSettings, FitResult, MemoryBudget
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.parallel import parallel_for
from wkvlab.plan.screen import ScreenResult
from wkvlab.plan.quality import QualityEstimate, estimate_quality
from wkvlab.plan.source import ModelSource, resolve_source
from wkvlab.plan.throughput import RooflineAssumptions, ThroughputEstimate
from wkvlab.preflight import check_group_widths
from wkvlab.plan.verdict import EXACT, UNSAFE, WITHIN, Verdict, VerdictRule, guard_verdicts
from wkvlab.plan.weights import Execution, WeightBytes, as_weight_spec, execution, is_gguf, weight_bytes
from wkvlab.weights.spec import WeightSpec

QUALITY_TIERS = (0.005, 0.03)  # near-lossless; 8-bit class (W8A8 0.0225 on Llama-3-8B); 4-bit class above
SPEED_TIE = 0.05  # relative decode-speed difference the roofline estimate cannot resolve
ROOM = 2  # a config that fits this many times the requested batch has room to spare: memory is not the constraint


@dataclass(frozen=True)
class Combination(JsonMixin):
    weights: str
    kv: str
    engine: str  # engine whose rule the headline numbers use ("none" if no engine accepts)
    weight_bytes: WeightBytes  # the whole checkpoint
    kv_bytes: KVBytes  # the spec's own bytes per token, every layer and head (what wkvlab measures)
    fit: FitResult  # the headline engine's, on its tightest GPU
    budget: MemoryBudget  # that GPU's
    gpu_weights_bytes: int  # weights on that GPU
    throughput: ThroughputEstimate
    quality: QualityEstimate
    evaluations: tuple[EngineEvaluation, ...]
    execution: Execution  # how the weights' GEMMs run
    kv_min_bits: float  # bits per value of the cache's least precise format (scales included)
    rank: int | None = None  # 1 = best; None = does not fit or no engine accepts it
    ranking_notes: tuple[str, ...] = ()
    verdict: Verdict | None = None  # what the plan's verdict rule allows (set when ranked)

    @property
    def recommendable(self) -> bool:
        return self.verdict is not None and self.verdict.recommendable

    @property
    def engines_accepting(self) -> tuple[str, ...]:
        return tuple(e.engine for e in self.evaluations if e.support.accepted)

    @property
    def fits(self) -> bool:
        return self.engine != "none" and self.fit.fits

    def evaluation(self, engine: str) -> EngineEvaluation | None:
        return next((e for e in self.evaluations if e.engine == engine), None)


@dataclass(frozen=True)
class Recommendation(JsonMixin):
    engine: str
    weights: str
    kv: str
    command: LaunchCommand
    why: tuple[str, ...]
    verified: bool = True  # False: the engine's best row is a prior — "unverified on this model"


@dataclass(frozen=True)
class PlanResult(JsonMixin):
    model: ModelDescription
    source: ModelSource
    gpu: GPU
    layout: Layout
    batch: int
    ctx: int
    engine: str | None
    rows: tuple[Combination, ...]  # ranked rows first, then the rest in grid order
    recommendations: tuple[Recommendation, ...]
    notes: tuple[str, ...]
    settings: EngineSettings
    assumptions: RooflineAssumptions
    measured: int = 0  # measurements that applied to this model (or transferred to it)
    wkvlab_version: str = __version__
    label: str = "planning estimate: exact bytes, estimated reserves/speed, measured quality where given, else priors"
    warnings: tuple[str, ...] = field(default=())
    screen: ScreenResult | None = None  # the outlier screen of the key projections (--screen)
    probe_cost: dict | None = None  # what the probe measured and what it cost (seconds, tokens, configurations)
    measure_hint: str = ""  # the command that measures the unmeasured rows


def kv_display(spec: KVSpec, model: ModelDescription) -> str:
    """The 16-bit cache is named after the model's dtype (wkvlab's fp16 means 'model precision')."""
    return model.dtype if spec == KVSpec() else spec.label


def default_grid(model: ModelDescription, gpu: GPU, engine: str | None, weights: list[WeightSpec] | None,
                 kv: list[KVSpec] | None) -> tuple[list[tuple[WeightSpec, KVSpec]], list[str]]:
    """(weights, kv) pairs to evaluate, and notes on substitutions made."""
    notes: list[str] = []
    d = model.dtype
    fp8_kv = "fp8_e4m3" if gpu.sm >= 89 else "fp8_e5m2"
    if gpu.sm < 89:
        notes.append(f"{gpu.name} (sm_{gpu.sm}) has no FP8 tensor cores: the default grid uses "
                     "fp8_e5m2 KV (E4M3 KV needs sm_89+ in vLLM/SGLang's Triton kernels, vllm#26431)")
    served_w = [d, "fp8", "w8a8-int8", "int4-g128"]
    served_kv = [d, fp8_kv, "int8", "int4"]
    # llama.cpp's own caches: its block types with the rotation it applies (PR #21038)
    gguf_w, gguf_kv = ["q8_0", "q4_0"], [d, "llamacpp:q8_0", "llamacpp:q4_0"]
    if engine == "llama.cpp":
        served_w, served_kv, gguf_w = [], [], [d, "q8_0", "q4_0"]
    elif engine == "sglang":
        served_kv, gguf_w = [d, fp8_kv], []
    elif engine in ("vllm", "trtllm"):
        gguf_w = []
        if engine == "trtllm":
            served_kv = [d, "fp8_e4m3", "int8"] if gpu.sm >= 89 else [d, "int8"]
    W = lambda names: [as_weight_spec(n, model) for n in names]  # noqa: E731
    K = lambda names: [as_kv_spec(n) for n in names]  # noqa: E731
    if weights and kv:
        return [(w, k) for w in weights for k in kv], notes
    if weights:
        # Pair each given weight format with the KV caches of the engines that load it.
        return [(w, k) for w in weights for k in K(gguf_kv if is_gguf(w) or engine == "llama.cpp" else served_kv or gguf_kv)], notes
    if kv:
        return [(w, k) for k in kv for w in W(gguf_w if _llamacpp_only_kv(k) else (served_w or gguf_w))], notes
    return [(w, k) for w in W(served_w) for k in K(served_kv)] + [(w, k) for w in W(gguf_w) for k in K(gguf_kv)], notes


def K_LLAMACPP(model: ModelDescription) -> list[KVSpec]:  # noqa: N802 - the default llama.cpp caches of default_grid
    return [as_kv_spec(n) for n in (model.dtype, "llamacpp:q8_0", "llamacpp:q4_0")]


def _no_requantizing_up(pairs: list[tuple[WeightSpec, KVSpec]], source: ModelSource,
                        model_id: str | None) -> tuple[list[tuple[WeightSpec, KVSpec]], list[str]]:
    """Without a 16-bit checkpoint, a GGUF block format of as many bits as the quantized file or more is only a
    re-quantization of it upwards: never an improvement, so never a row."""
    if model_id or source.folder or source.hub_id:
        return pairs, []
    up = {w.label for w, _ in pairs if is_gguf(w) and w.bits >= source.file_bits}
    kept = [(w, k) for w, k in pairs if w.label not in up]
    note = [f"not planned: {', '.join(sorted(up))} — re-quantizing the {source.gguf_type_name} file up is no more faithful than "
            "the file (its rounding stays in it) and larger; serve the file as it is (its own row), or pass the 16-bit "
            "checkpoint with --model-id"] if up else []
    return kept, note


def _llamacpp_only_kv(spec: KVSpec) -> bool:
    return spec.k != spec.v or spec.rotate != 0 or any(f.name.startswith(("q", "iq")) for f in spec.all_formats())


def plan(model: str | Path | ModelDescription, gpu: str | GPU, batch: int, ctx: int,
         weights: Iterable[str | WeightSpec] | None = None, kv: Iterable[str | KVSpec] | None = None,
         engine: str | None = None, measurements: list[Measurement] | None = None,
         gpu_file: str | Path | None = None, settings: EngineSettings = EngineSettings(),
         assumptions: RooflineAssumptions = RooflineAssumptions(), *, gpus: int = 1, tp: int | None = None,
         pp: int | None = None, split: str | None = None, model_id: str | None = None,
         versions: dict[str, str] | None = None, probe: Callable[..., list[Measurement]] | None = None,
         screen: bool = False, verdict: VerdictRule = guard_verdicts) -> PlanResult:
    """Evaluate and rank weight x KV combinations (see the module docstring for the rules).

    ``probe`` (:class:`~wkvlab.plan.probe.Probe`): called with (model, source, KV formats, weight
    formats, context) after the rows are costed; what it measures ranks like the user's own
    measurements, which win where both measured a configuration. ``screen``: read the key projections
    (:mod:`~wkvlab.plan.screen`, no forward pass) and name the flagged layers in the unmeasured rows.
    ``verdict``: which rows may be recommended (:mod:`.verdict`); the catastrophe guard by default. A
    tolerance decision (:func:`~wkvlab.plan.verdict.tolerance_rule`: within / exceeds / undecided, Holm over the measured
    configurations; those within ranked by memory) is passed here."""
    desc, source = resolve_source(model)
    device = find_gpu(gpu, load_gpu_catalog(gpu_file)) if not isinstance(gpu, GPU) else gpu
    check_size(desc, batch, ctx)
    eng = normalize_engine(engine)
    check_inputs(desc, weights, eng, gpus, tp, pp, split)
    measured, notes = index_measurements(measurements or [], desc, source.aliases)
    w_specs = [as_weight_spec(w, desc) for w in weights] if weights else None
    k_specs = [as_kv_spec(k) for k in kv] if kv else None
    pairs, grid_notes = default_grid(desc, device, eng, w_specs, k_specs)
    notes += grid_notes
    if source.quantized_file:
        pairs, dropped_up = _no_requantizing_up(pairs, source, model_id)
        notes += dropped_up
        notes.append(f"reference: quality is KLD to the dequantized {Path(source.gguf).name} ({source.gguf_type_name}), the weights "
                     "wkvlab loads — 0 means 'as the file', not 'as the original 16-bit model': the file's own rounding is in the "
                     "reference, so configs are compared with the file, and a config quantized from the original checkpoint "
                     "is measured against the file too")
    if measured and not (weights or kv):  # every combination the user measured on this model joins the grid
        pairs += measured_pairs(measurements or [], desc, measured)
    unique: dict[tuple, tuple[WeightSpec, KVSpec]] = {}
    for w, k in pairs:
        unique.setdefault(spec_key(w, k), (w, k))
    pairs = list(unique.values())
    layout = Layout(gpus, tp, pp, split)
    c = Context(desc, source, device, batch, ctx, layout, settings, assumptions, model_id, versions)
    engines = (eng,) if eng else ENGINES
    rows = [_evaluate(c, w, k, engines, measured) for w, k in pairs]
    if source.gguf and (eng in (None, "llama.cpp")) and not weights:
        # the file as it is, with llama.cpp's caches: measured as the model's own weights (the reference is this file)
        as_is = [(as_weight_spec("none", desc), k) for k in ([as_kv_spec(desc.dtype)] + [k for k in (k_specs or []) if not k.is_identity]
                                                             if kv else K_LLAMACPP(desc))]
        rows += [_evaluate_as_is(c, k, measured) for _, k in as_is]
        pairs += as_is
    probed: list[Measurement] = []
    if probe is not None and getattr(probe, "applies", lambda source: True)(source):
        from wkvlab.plan.probe import candidates, weights_are_served

        served = weights_are_served(source, model_id)
        probed = probe(desc, source, *candidates(desc, pairs, rows, with_weights=served), ctx)
        if not served:
            other = "--model-id, another checkpoint" if model_id else f"{source.served or 'another checkpoint'}, not the file the probe ran"
            notes.append(f"the probe measured the KV formats on the weights it loaded ({source.given}); weight formats were not "
                         f"probed: the launch lines load {other}")
        rows, pairs, measured = _remeasure(c, rows, pairs, engines, measurements or [], probed, bool(weights or kv), notes)
        # combinations an engine would otherwise launch unmeasured: measured too, while the budget lasts
        names = {(r.weights, r.kv): pair for r, pair in zip(rows, pairs)}
        wanted = _unverified_tops(_rank(rows, device, ctx, verdict, batch), names, eng)
        if wanted and hasattr(probe, "pairs"):
            probed += probe.pairs(desc, source, wanted, ctx)
            rows, pairs, measured = _remeasure(c, rows, pairs, engines, measurements or [], probed, bool(weights or kv), notes)
        notes += list(getattr(probe, "notes", []))
    screened = None
    if screen:
        from wkvlab.plan.screen import screen_model

        screened = screen_model(desc, source)
        if screened.flagged:
            words = f"; the outlier screen flags {len(screened.flagged)} of {len(screened.layers)} layers"
            rows = [replace(r, quality=replace(r.quality, caution=r.quality.caution + words)) if "keys per token" in r.quality.caution else r
                    for r in rows]
    ranked = _rank(rows, device, ctx, verdict, batch)
    recs = _recommend(ranked, eng, ctx, batch)
    hint = measure_hint(source, desc) if any(not r.verified for r in recs) or not probed else ""
    notes += ["GB = 10^9 bytes, GiB = 2^30 bytes; bytes are exact, reserves and speeds are estimates",
              "quality = mean KLD vs the 16-bit model (nats/token): 'measured' = your results for this model, 'transfer' = a smaller "
              "model of its family, 'prior' = data/quality_priors.yaml (each value with its source)"]
    notes += _unrunnable_measurements(ranked)
    warnings = []
    if eng == "trtllm":
        notes.append("TensorRT-LLM: support and memory only, no launch line is written "
                     "(set KvCacheConfig.dtype and the quantization in its LLM API options)")
    for name in ((eng,) if eng else COMMAND_ENGINES):
        dropped = dropped_by_guard(ranked, name)
        if dropped and not any(r.engine == name for r in recs):
            warnings.append(f"{name}: no launch line: every combination it runs here was dropped as unsafe or outside the tolerance ({'; '.join(dropped)})")
    warnings += _why_nothing(ranked, desc, batch, ctx, layout, device)
    warnings += _engines_refusing_the_split(ranked, desc, layout, engines)
    cost = getattr(probe, "cost", None) if probed else None
    return PlanResult(desc, source, device, layout, batch, ctx, eng, tuple(ranked), tuple(recs), tuple(dict.fromkeys(notes)),
                      settings, assumptions, len(measured), warnings=tuple(warnings), screen=screened,
                      probe_cost=cost.__dict__.copy() if cost is not None else None, measure_hint=hint)


def _remeasure(c: Context, rows: list[Combination], pairs: list[tuple[WeightSpec, KVSpec]], engines: tuple[str, ...],
               given: list[Measurement], probed: list[Measurement], fixed_grid: bool, notes: list[str]):
    """Rows re-estimated with the probe's measurements; what it measured beyond the grid joins it (unless the user named the grid)."""
    measured, more = index_measurements(given + probed, c.model, c.source.aliases)
    notes += more
    rows = [replace(row, quality=estimate_quality(c.model, w, k, measured)) for row, (w, k) in zip(rows, pairs)]
    if not fixed_grid:
        known = {spec_key(w, k) for w, k in pairs}
        extra = [(w, k) for w, k in measured_pairs(probed, c.model, measured) if spec_key(w, k) not in known]
        extra = list({spec_key(w, k): (w, k) for w, k in extra}.values())
        rows = rows + [_evaluate(c, w, k, engines, measured) for w, k in extra]
        pairs = pairs + extra
    return rows, pairs, measured


def _unverified_tops(ranked: list[Combination], names: dict[tuple[str, str], tuple[WeightSpec, KVSpec]],
                     engine: str | None) -> list[tuple[WeightSpec, KVSpec]]:
    """Per engine with no recommendable row, the (weights, KV) of the row it would launch unmeasured."""
    out: dict[tuple, tuple[WeightSpec, KVSpec]] = {}
    for rec in _recommend(ranked, engine, 1, 1):
        pair = names.get((rec.weights, rec.kv))
        if not rec.verified and pair is not None:
            out.setdefault(spec_key(*pair), pair)
    return list(out.values())


def measure_hint(source: ModelSource, model: ModelDescription) -> str:
    """The command that measures this model's rows (the planner probes what it can load)."""
    if source.kind in ("packaged", "gguf", "folder"):
        return f"wkvlab plan --model {source.given} ... (probes by default; raise --probe-budget to measure more)"
    target = source.hub_id or "<the model's Hub id>"
    folder = f"./{(source.hub_id or model.name).split('/')[-1]}"
    return (f"huggingface-cli download {target} --local-dir {folder}, then "
            f"wkvlab plan --model {folder} ... (probes each KV and weight config before ranking), or "
            f"wkvlab eval --model {folder} --weights <W> --kv <K>")


def check_size(model: ModelDescription, batch: int, ctx: int) -> None:
    """Batch and context checked before anything loads: a context past the one the model was trained for is refused
    (vLLM refuses a --max-model-len above it too; llama.cpp runs it with a warning, and quality past it is not what was
    trained), with the models that do have that context."""
    if batch < 1 or ctx < 1:
        raise ConfigError(f"batch and ctx must be at least 1 (got batch={batch}, ctx={ctx})")
    limit = model.max_position_embeddings
    if ctx > limit:
        from wkvlab.models.packaged import PACKAGED_MODELS

        longer = [f"--model {p.name} ({p.context:,})" for p in PACKAGED_MODELS.values() if p.context >= ctx]
        raise ConfigError(f"--context {ctx:,} exceeds {model.name}'s context of {limit:,} tokens (max_position_embeddings, a "
                          f"GGUF's context_length): engines refuse a longer one or run it untrained; plan at --context {limit} or "
                          "less, or a model trained for it" + (f": {', '.join(longer)}" if longer else ""))


def check_inputs(model: ModelDescription, weights: Iterable[str | WeightSpec] | None, engine: str | None, gpus: int,
                 tp: int | None, pp: int | None, split: str | None) -> None:
    """Every planner input checked before anything runs, with eval's own checks where eval has one: the layout,
    weight groups that fit no layer, and a split that the one engine asked for cannot run."""
    from wkvlab.plan.parallel import layouts_that_run, parallel_problems

    parallel_for(None, gpus, tp, pp)  # a bad layout is the user's error, not a refusal of every engine
    parallel_for("llama.cpp", gpus, split=split)
    check_group_widths([as_weight_spec(w, model) for w in weights or []], input_widths(model), model.name)
    if engine in ("vllm", "sglang", "trtllm"):
        par = parallel_for(engine, gpus, tp, pp, split)
        problems = parallel_problems(engine, model, par)
        if problems:
            options = [f"--tp {p.tp} --pp {p.pp}" for p in layouts_that_run(engine, model, gpus)]
            raise ConfigError(f"{engine} cannot run {model.name} as tp {par.tp} x pp {par.pp}: {'; '.join(problems)}; "
                              + (f"use {' or '.join(options)}" if options else "use another GPU count or --engine llama.cpp"))


def input_widths(model: ModelDescription) -> tuple[int, ...]:
    """The input widths of the quantized linear layers, from the description (as preflight reads them from the files)."""
    mlp = model.moe.expert_intermediate_size if model.moe is not None else model.intermediate_size
    return tuple(sorted({model.hidden_size, model.num_heads * model.head_dim, mlp}))


def _engines_refusing_the_split(ranked: list[Combination], model: ModelDescription, layout: Layout,
                                engines: tuple[str, ...]) -> list[str]:
    """Why an engine runs nothing of the plan on this GPU split (its divisibility rules), and which splits it would run."""
    from wkvlab.plan.parallel import layouts_that_run, parallel_problems

    out = []
    for name in engines:
        if name == "llama.cpp" or any((ev := r.evaluation(name)) is not None and ev.support.accepted for r in ranked):
            continue
        try:
            par = parallel_for(name, layout.gpus, layout.tp, layout.pp, layout.split)
        except ConfigError:
            continue
        problems = parallel_problems(name, model, par)
        if not problems:
            continue
        options = [f"--tp {p.tp} --pp {p.pp}" for p in layouts_that_run(name, model, layout.gpus)]
        out.append(f"{name} runs nothing here: tp {par.tp} x pp {par.pp} on {layout.gpus} GPUs — {'; '.join(problems)}"
                   + (f"; it would run {' or '.join(options)}" if options else ""))
    return out


def _why_nothing(ranked: list[Combination], model: ModelDescription, batch: int, ctx: int, layout: Layout, gpu: GPU) -> list[str]:
    """'nothing fits' only when something was accepted and nothing fits; otherwise why no engine runs it."""
    if any(r.fits for r in ranked):
        return []
    accepted = [r for r in ranked if r.engine != "none"]
    if accepted:
        return [f"nothing fits {model.name} at batch {batch} x ctx {ctx} on {layout.gpus} x {gpu.name}; "
                "lower batch or ctx, or use more GPUs (--gpus)"]
    reasons: dict[str, str] = {}
    for row in ranked:
        for ev in row.evaluations:
            if ev.support.reasons:
                reasons.setdefault(ev.engine, ev.support.reasons[0])
    return [f"no engine runs {model.name} here: " + "; ".join(f"{e}: {why}" for e, why in reasons.items())]


def measured_pairs(measurements: list[Measurement], model: ModelDescription, measured: dict) -> list[tuple[WeightSpec, KVSpec]]:
    """The (weights, KV) of every measurement that applies to ``model``, named as the plan's rows
    (:func:`~wkvlab.plan.measured.model_spec_key`: ``none`` weights as the checkpoint's dtype)."""
    out = []
    for m in measurements:
        try:
            w, k = as_weight_spec(WeightSpec.from_dict(m.weights_spec), model), KVSpec.from_dict(m.kv_spec)
        except WkvlabError:
            continue  # index_measurements notes it
        if spec_key(w, k) in measured:
            out.append((w, k))
    return out


def _unrunnable_measurements(rows: list[Combination]) -> list[str]:
    """Why no engine runs a combination the user measured: each engine's first reason, once per distinct reason."""
    by_why: dict[str, list[str]] = {}
    for row in rows:
        if row.engine == "none" and row.quality.is_measured:
            why = "; ".join(e.support.reasons[0] for e in row.evaluations if e.support.reasons)
            by_why.setdefault(why, []).append(f"{row.weights} x {row.kv}")
    return [f"measured but no engine runs {', '.join(pairs)} here — {why}" for why, pairs in by_why.items()]


def _evaluate(c: Context, w: WeightSpec, k: KVSpec, engines: tuple[str, ...], measured: dict) -> Combination:
    whole = weight_bytes(c.model, w)
    spec_kv = kv_bytes_per_token(c.model, k, context=c.ctx)
    results = [evaluate_engine(engine, c, w, k) for engine in engines]
    evaluations = tuple(r[0] for r in results)
    accepted = [r for r in results if r[0].support.accepted]
    head = next((r for r in accepted if r[0].fit.fits), accepted[0] if accepted else results[0])
    primary = head[0].engine if accepted else "none"
    binding = min(head[0].gpus, key=lambda g: (g.fit.max_batch, g.fit.headroom_bytes))
    speed = evaluate_speed(c, w, head[0], *head[1:])
    quality = estimate_quality(c.model, w, k, measured)
    return Combination(w.label, kv_display(k, c.model), primary, whole, spec_kv, head[0].fit, binding.budget, binding.weights_bytes,
                       speed, quality, evaluations, execution(w), min_bits(k, c.model.head_dim))


AS_IS = "(the file as it is)"


def _evaluate_as_is(c: Context, k: KVSpec, measured: dict) -> Combination:
    """The GGUF itself on llama.cpp: its own bytes (every tensor as stored: token embedding in the file's type, the output
    matrix as stored or tied to the embedding, norms f32), its own quality (the reference is this file)."""
    bits = c.source.file_bits if 0 < c.source.file_bits < 16 else 0
    stand_in = WeightSpec.parse({8: "q8_0", 5: "q5_0", 4: "q4_0"}.get(bits, "q4_0")) if bits else as_weight_spec(c.model.dtype, c.model)
    as_file = replace(c, model_id=c.source.gguf, file_bytes=c.source.gguf_bytes)
    row = _evaluate(as_file, stand_in, k, ("llama.cpp",), {})
    own = as_weight_spec("none", c.model)
    label = f"{c.source.gguf_type_name or Path(c.source.gguf).suffix} {AS_IS}"
    whole = replace(row.weight_bytes, weights=label, total_bytes=c.source.gguf_bytes)
    return replace(row, weights=label, weight_bytes=whole, quality=estimate_quality(c.model, own, k, measured))


def _rank_key(row: Combination, gpu: GPU, unconstrained: bool = False) -> tuple:
    fp8_elsewhere = int(row.execution.compute == "fp8" and not gpu.has_native("fp8"))
    slow = int(any(e.support.slow_path for e in row.evaluations if e.engine == row.engine))
    if row.recommendable:
        kld = 0.0 if row.quality.exact else row.quality.kld
        if unconstrained:  # the most faithful first; speed only among equal KLDs
            return fp8_elsewhere, slow, 0, 0, kld, -row.throughput.decode.tokens_per_s
        return fp8_elsewhere, slow, 0, 0, 0, kld
    low_kv = int(row.kv_min_bits < 8)
    tier = sum(row.quality.kld > t for t in QUALITY_TIERS)
    return fp8_elsewhere, slow, 2, low_kv, tier, -row.throughput.decode.tokens_per_s


def _shown_ties(first: Combination, peers: list[Combination]) -> dict[int, object]:
    """Verdicts of each peer's KLD minus ``first``'s (the lowest), by the one rule: paired per-unit (document)
    differences, m 10% of ``first``'s KLD estimated on the same units, Holm over the peers tested; keyed by ``id``.

    A tie is a peer shown *equivalent within ±m*. Token-level standard errors (tokens treated as independent)
    are far too narrow for this, so a row with no per-unit values on ``first``'s units is not tested at all; nor is
    one with another number of replicates (a store's replicates pair run by run, and pool as the findings do)."""
    base = first.quality.units
    if base is None:
        return {}
    tested = [r for r in peers if r is not first and r.quality.units is not None and r.quality.units.pairs_with(base)]
    if not tested:
        return {}
    from wkvlab.stats.decision import MarginRule, decide

    name = f"{first.weights} x {first.kv}"
    own = base.resampled("kld")
    effects = [MarginRule().difference_effect(f"{r.weights} x {r.kv} − {name}", r.quality.units.resampled("kld", minus=base), own,
                                              f"KLD of {name}", sum(base.tokens), unit="nats") for r in tested]
    return {id(r): v for r, v in zip(tested, decide(effects, family=f"KLD against {name}, the lowest: ties broken by speed"))}


def _order(rows: list[Combination], gpu: GPU, unconstrained: bool = False, ties: dict | None = None) -> list[Combination]:
    """Sort by the rank key; ties (shown equivalent by the one rule for measured KLD, 5% for estimated speed) go to
    the other criterion. ``ties`` collects the verdict that let a faster measured row go first, by ``id``."""
    key = lambda r: _rank_key(r, gpu, unconstrained)  # noqa: E731
    remaining = sorted(rows, key=key)
    if unconstrained:
        return remaining
    out: list[Combination] = []
    while remaining:
        first = remaining[0]
        group = key(first)[:5]
        peers = [r for r in remaining if key(r)[:5] == group]
        if group[2] == 0:  # measured: KLDs shown equivalent go to the faster (under a tolerance rule, _rank orders by memory)
            verdicts = _shown_ties(first, peers)
            close = [first] + [r for r in peers if getattr(verdicts.get(id(r)), "outcome", "") == "within"]
            pick = max(close, key=lambda r: r.throughput.decode.tokens_per_s)
            if pick is not first and ties is not None:
                ties[id(pick)] = verdicts[id(pick)]
        else:
            fastest = first.throughput.decode.tokens_per_s
            close = [r for r in peers if r.throughput.decode.tokens_per_s >= (1 - SPEED_TIE) * fastest]
            pick = min(close, key=lambda r: r.quality.kld)
        out.append(pick)
        remaining.remove(pick)
    return out


def _rank(rows: list[Combination], gpu: GPU, ctx: int, verdict: VerdictRule = guard_verdicts, batch: int = 1) -> list[Combination]:
    """Ranked fitting rows (recommendable first), then the rows the verdict dropped (no rank), then the rest."""
    rows = [replace(r, verdict=v) for r, v in zip(rows, verdict([r.quality for r in rows]))]
    fitting = [r for r in rows if r.fits and not r.verdict.dropped]
    exact = [r for r in fitting if r.verdict.state == EXACT and not r.quality.unsafe]
    candidates = [r for r in fitting if r.recommendable]
    faithful = min(candidates, key=lambda r: (0.0 if r.quality.exact else r.quality.kld), default=None)
    # memory is not the constraint when the checkpoint itself fits, or the most faithful candidate fits twice the batch
    roomy = exact or ([faithful] if faithful is not None and faithful.fit.max_batch >= ROOM * batch else [])
    unconstrained = bool(roomy)
    # a tolerance rule: every recommendable row is shown within the user's tolerance, so quality no longer orders
    # them — the smallest memory at this batch x context does (the speed estimate breaks ties)
    by_memory = bool(candidates) and all(r.verdict.state == WITHIN for r in candidates)
    ties: dict = {}  # a faster row ranked over a lower KLD: the verdict that showed them equivalent
    if by_memory:
        unconstrained = False
        good = sorted(candidates, key=lambda r: (_memory(r), -r.throughput.decode.tokens_per_s))
    else:
        good = _order(candidates, gpu, unconstrained, ties)
        good = [r for r in good if r.quality.exact and AS_IS in r.weights] + [r for r in good if not (r.quality.exact and AS_IS in r.weights)]
    ordered = good + _order([r for r in fitting if not r.recommendable], gpu)
    dropped = [replace(r, ranking_notes=(f"{r.verdict.state}: {r.verdict.reason}{_guard_rule(r)}: never recommended",))
               for r in rows if r.fits and r.verdict.dropped]
    out = []
    for i, row in enumerate(ordered, 1):
        fp8_elsewhere, slow, evidence, low_kv, tier, _ = _rank_key(row, gpu)
        why = []
        if fp8_elsewhere:
            why.append(f"FP8 weights on {gpu.name}: no FP8 tensor cores, ranked last")
        if slow:
            why.append(f"{row.engine} takes a silent slow path here (see warnings): ranked after fast paths")
        if row.recommendable and by_memory:
            why.append(f"{row.verdict.reason}; memory {_memory(row) / 1e9:.2f} GB at batch {batch} x ctx {ctx} (weights + KV on "
                       f"{row.fit.binding_gpu})" + (" — the smallest shown within tolerance" if row is good[0] else
                                                    f" (smallest within tolerance: {good[0].weights} x {good[0].kv})"))
        elif row.recommendable and unconstrained:
            spare = max(roomy, key=lambda r: r.fit.headroom_bytes)
            what = "the checkpoint itself" if spare.quality.exact else "the most faithful measured config"
            why.append(f"memory is not the constraint: {spare.weights} x {spare.kv} ({what}) fits on {spare.engine} with "
                       f"{spare.fit.headroom_bytes / 1e9:.1f} GB to spare (up to {spare.fit.max_batch} sequences, {batch} asked), so the "
                       f"most faithful measured config that fits ranks first (KLD {0.0 if row.quality.exact else row.quality.kld:.5f}; "
                       "no speed tie-break)")
        elif row.recommendable:
            best = min(good, key=lambda r: r.quality.kld)
            spread = f" {row.quality.interval}" if row.quality.interval else " (no interval over documents kept)"
            tie = ties.get(id(row))
            why.append(f"decided by {row.quality.label}: KLD {row.quality.kld:.5f}{spread}"
                       + (" — the lowest that fits" if row is best else
                          f"; ranked for speed over the lower KLD {best.quality.kld:.5f}, {tie.describe('.3g')}" if tie is not None else
                          f" (lowest fitting: {best.quality.kld:.5f}; a faster config goes first only when shown equivalent within ±m "
                          "by the one rule on per-document values)"))
        else:
            why.append(f"{row.verdict.reason}: never recommended")
            if low_kv:
                why.append("KV below 8 bits: ranked after 8-bit caches until measured"
                           + (f" (at ctx {ctx:,}: measure it at this length; no prior covers its penalty at this depth)" if ctx >= 16384 else ""))
            bound = f"<= {QUALITY_TIERS[tier]}" if tier < len(QUALITY_TIERS) else f"> {QUALITY_TIERS[-1]}"
            evidence = "the measured KLD" if row.quality.is_measured else "the prior"  # measured but undecided under --tolerance
            why.append(f"ordered by {evidence}: quality tier {tier + 1} of {len(QUALITY_TIERS) + 1} (KLD {bound}), then speed")
        out.append(replace(row, rank=i, ranking_notes=tuple(why)))
    return out + dropped + [r for r in rows if not r.fits]


def _guard_rule(row: Combination) -> str:
    """The catastrophe guard's thresholds, for a row it dropped (a tolerance rule's reason states its own test)."""
    return f" ({thresholds()})" if row.verdict is None or row.verdict.state == UNSAFE else ""


def _memory(row: Combination) -> int:
    """Bytes the row needs on its tightest GPU at the requested batch x context: its weights there plus the KV cache."""
    return row.gpu_weights_bytes + row.fit.kv_needed_bytes


def dropped_by_guard(rows: list[Combination], engine: str) -> list[str]:
    """Why ``engine``'s launch line is not one of the combinations the catastrophe guard dropped."""
    return [f"dropped {row.weights} x {row.kv}: {row.verdict.reason if row.verdict else row.quality.unsafe}{_guard_rule(row)}" for row in rows
            if (row.verdict.dropped if row.verdict else row.quality.unsafe) and row.fits and (ev := row.evaluation(engine)) is not None and ev.support.accepted]


def _recommend(rows: list[Combination], engine: str | None, ctx: int, batch: int) -> list[Recommendation]:
    """Each engine's best recommendable row; where it has none, its best prior row, labelled unverified."""
    recs = []
    for name in ((engine,) if engine else COMMAND_ENGINES):
        runnable = [r for r in rows if r.rank is not None and (ev := r.evaluation(name)) is not None and ev.command is not None]
        row = next((r for r in runnable if r.recommendable), runnable[0] if runnable else None)
        if row is None:
            continue
        ev = row.evaluation(name)
        g = min(ev.gpus, key=lambda x: x.fit.max_batch)
        per = " per GPU" if ev.parallel.gpus > 1 else ""
        verified = row.recommendable
        quality = ("quality: exact (the checkpoint itself)" if row.quality.exact else f"quality KLD ~{row.quality.kld:.4f} ({row.quality.label})"
                   if verified else f"UNVERIFIED ON THIS MODEL: prior KLD ~{row.quality.kld:.4f} ({row.quality.source}), not a measurement")
        why = (f"rank {row.rank} among {sum(r.rank is not None for r in rows)} fitting combinations",
               f"{ev.parallel.label}: {row.weights} weights {g.weights_bytes / 1e9:.1f} GB{per} + {row.kv} KV "
               f"{g.fit.kv_needed_bytes / 1e9:.1f} GB{per} fit the {g.budget.kv_pool_bytes / 1e9:.1f} GB KV pool"
               f"{' of ' + g.name if ev.parallel.gpus > 1 else ''}; up to {ev.fit.max_batch} sequences at {ctx} tokens",
               f"decode ~{row.throughput.decode.tokens_per_s:.0f} tok/s at batch {batch} "
               f"({row.throughput.decode.bound}-bound, estimate)",
               quality, *row.ranking_notes, *ev.support.warnings, *dropped_by_guard(rows, name))
        recs.append(Recommendation(name, row.weights, row.kv, ev.command, why, verified))
    return recs
