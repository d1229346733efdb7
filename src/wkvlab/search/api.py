"""Profile and search as Python functions; ``wkvlab profile``/``wkvlab search`` only parse and print.

    >>> from wkvlab.search import api
    >>> result = api.search(model="default", budget=9000, weights="int4-g128")
    >>> result.chosen.name, result.verdict

Text: profiling windows are cut from the start of the corpus, held-out windows right after them
(never overlapping), calibration samples (GPTQ/AWQ weights only) from its end.
"""
from __future__ import annotations

import hashlib
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager

import torch

from wkvlab.data import Corpus, WindowSet, load_corpus, make_windows, tokenize, tokenizer_wants_bos
from wkvlab.errors import ConfigError, DataError
from wkvlab.models.loading import LoadedModel, cache_dir, load_model
from wkvlab.search.allocate import candidate_allocations, allocate_exact
from wkvlab.search.baselines import Candidate, baseline_candidates
from wkvlab.search.choices import FP16, Choice, check_budget_options, choice_bytes, choice_label, nothing_fits, parse_choices
from wkvlab.search.export import engine_exports, layer_recipe, plan_kvspec
from wkvlab.search.measure import Score, Scorer, paired_draws
from wkvlab.search.pareto import Point, pareto_front
from wkvlab.search.predict import Predictor, predictor_from_profile, spearman
from wkvlab.search.profile import SensitivityProfile, collect_profile, profile_key, profile_steps
from wkvlab.stats.decision import DEFAULT_MARGIN, Effect, Margin, decide
from wkvlab.weights.apply import model_weight_bytes, quantize_model_weights
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec, calibration_corpus, calibration_set
from wkvlab.weights.spec import WeightSpec

# (title, total steps) -> a context yielding the (description, steps) callback; the CLI passes a rich bar.
Bars = Callable[[str, int], ContextManager]


def _no_bars(_title: str, _total: int):
    return nullcontext(lambda _d, _n: None)


@dataclass
class SearchData:
    loaded: LoadedModel
    corpus: Corpus
    profile: WindowSet
    heldout: WindowSet
    calibration_reserved: int  # leading corpus tokens the windows use


def prepare_search(model: str | LoadedModel = "default", data: str = "default", *, ctx: int = 256,
                   profile_tokens: int = 256, heldout_tokens: int = 512) -> SearchData:
    corpus = load_corpus(data)
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    if ctx > loaded.max_context:
        raise ConfigError(f"--ctx {ctx} is longer than {loaded.name}'s maximum context {loaded.max_context}")
    for what, n in (("--profile-tokens", profile_tokens), ("--heldout-tokens", heldout_tokens)):
        if n < ctx:
            raise ConfigError(f"{what} {n} is less than one window of --ctx {ctx}; ask for at least {ctx}")
    ids = tokenize(loaded.tokenizer, corpus.text)
    bos = loaded.tokenizer.bos_token_id if tokenizer_wants_bos(loaded.tokenizer) else None
    body = ctx - (1 if bos is not None else 0)
    prof = make_windows(ids, ctx=ctx, n_tokens=profile_tokens, bos_id=bos)
    used = prof.n_windows * body
    wanted = max(1, heldout_tokens // ctx)
    if ids.numel() < used + wanted * body:
        raise DataError(f"{corpus.name} has {ids.numel()} tokens, too few for {prof.n_windows} profiling and {wanted} held-out windows of {ctx}; lower --profile-tokens/--heldout-tokens or --ctx")
    held = make_windows(ids[used:], ctx=ctx, n_tokens=heldout_tokens, bos_id=bos)
    return SearchData(loaded, corpus, prof, held, used + held.n_windows * body)


def _calibration(sd: SearchData, weights: WeightSpec, spec: CalibrationSpec | None) -> CalibrationSet | None:
    if not weights.needs_calibration:
        return None
    spec = spec or CalibrationSpec()
    corpus = calibration_corpus(spec.data)
    reserved = sd.calibration_reserved if corpus.sha256 == sd.corpus.sha256 else 0
    return calibration_set(spec, sd.loaded.tokenizer, corpus=corpus, reserved_tokens=reserved)


def numerics(loaded) -> dict:
    """What besides the weights changes a measured number: the dtype and the kind of device
    (a bfloat16 GPU profile must never be read back for a float32 CPU run)."""
    return {"dtype": loaded.dtype, "device": loaded.device.split(":")[0]}


def _fingerprints(sd: SearchData) -> dict:
    return {"model_sha256": sd.loaded.fingerprint, "data_sha256": sd.corpus.sha256, **numerics(sd.loaded)}


def cached_profile(reference: torch.nn.Module, windows: WindowSet, weights: WeightSpec, choices: tuple[Choice, ...], *,
                   model_name: str, data_name: str, fingerprints: dict, calibration: CalibrationSet | None = None,
                   weight_profile: bool = True, bars: Bars = _no_bars, use_cache: bool = True) -> tuple[SensitivityProfile, bool]:
    """A profile from the on-disk cache (content-addressed) or measured now and saved; (profile, was_cached)."""
    key = profile_key(fingerprints, weights, choices, windows, weight_profile, calibration)
    path = cache_dir() / "search-profiles" / f"{key}.json"
    if use_cache and path.is_file():
        return SensitivityProfile.load(path), True
    total = profile_steps(reference.config.get_text_config().num_hidden_layers, choices, weights, weight_profile)
    with bars(f"profile under {weights.label} weights", total) as tick:
        prof = collect_profile(reference, windows, weights, choices, model_name=model_name, data_name=data_name,
                               fingerprints=fingerprints, calibration=calibration, weight_profile=weight_profile, progress=tick)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.save(path)
    return prof, False


def profile(model: str | LoadedModel = "default", data: str = "default", *, weights: str = "int4-g128", formats: str | None = None,
            ctx: int = 256, tokens: int = 256, weight_profile: bool = True, bars: Bars = _no_bars,
            calibration: CalibrationSpec | None = None, use_cache: bool = True) -> SensitivityProfile:
    """Per-layer K/V and weight sensitivity, sinks and outlier channels under ``weights`` (cached on disk)."""
    spec, choices = WeightSpec.parse(weights), parse_choices(formats)
    sd = prepare_search(model, data, ctx=ctx, profile_tokens=tokens, heldout_tokens=ctx)
    prof, _ = cached_profile(sd.loaded.model, sd.profile, spec, choices, model_name=sd.loaded.name, data_name=sd.corpus.name,
                             fingerprints=_fingerprints(sd), calibration=_calibration(sd, spec, calibration),
                             weight_profile=weight_profile, bars=bars, use_cache=use_cache)
    return prof


# ---- the search ---------------------------------------------------------------------------------

@dataclass
class Row:
    name: str
    kind: str
    kv: str
    kv_bytes_per_token: float
    weight_bytes: int
    total_bytes: float  # weights + KV for batch x context tokens
    fits: bool
    predicted: float | None
    kld: float
    se: float
    method: str = ""
    notes: list = field(default_factory=list)
    score: Score | None = field(default=None, repr=False, compare=False)  # per-token KLD, for paired intervals

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "score"}


@dataclass
class SearchResult:
    model: str
    data: str
    weights: str
    budget: dict
    formats: list
    profile: dict  # summary: tokens, base KLD, seconds, cached
    predictor: dict
    rows: list
    chosen: Row | None
    verdict: str
    rank_correlation: float
    pareto: list
    plan: list  # per-layer choice labels of the chosen plan
    keep_16bit: list
    spec: dict  # KVSpec.to_dict() of the chosen plan
    exports: dict
    heldout_tokens: int

    def to_dict(self) -> dict:
        data = dict(self.__dict__)
        data["rows"] = [r.to_dict() for r in self.rows]
        data["chosen"] = self.chosen.to_dict() if self.chosen else None
        return data


def _plan_bytes(plan, kv_heads: int, head_dim: int) -> float:
    return sum(choice_bytes(c, kv_heads=kv_heads, head_dim=head_dim) for c in plan)


def gpu_budget(loaded_model: torch.nn.Module, name: str, gpu: str, weight_bytes: int, batch: int, context: int) -> dict:
    """Bytes per token left for the KV cache on ``gpu`` after the weights (vLLM's allocation rule)."""
    from wkvlab.plan.gpus import find_gpu
    from wkvlab.plan.memory import memory_budget
    from wkvlab.plan.models import ModelDescription

    desc = ModelDescription.from_config(loaded_model.config.to_dict(), name=name)
    mb = memory_budget(None, desc, find_gpu(gpu), weight_bytes)
    if mb.kv_pool_bytes <= 0:
        raise ConfigError(f"the weights alone do not fit {gpu} under vLLM's rule (KV pool {mb.kv_pool_bytes:,} B); choose a larger GPU")
    return {"bytes_per_token": mb.kv_pool_bytes / (batch * context), "source": f"{gpu}, batch {batch} x context {context}: "
            f"KV pool {mb.kv_pool_bytes:,} B ({mb.rule})"}


def search_windows(reference: torch.nn.Module, profile_windows: WindowSet, heldout: WindowSet, weights: WeightSpec,
                   choices: tuple[Choice, ...], budget: float, *, model_name: str = "model", data_name: str = "text",
                   fingerprints: dict | None = None, calibration: CalibrationSet | None = None, context: int = 8192,
                   batch: int = 1, candidates: int = 4, joint_weights: bool = False, unaware: bool = True,
                   weight_profile: bool = True, budget_source: str = "", bars: Bars = _no_bars, use_cache: bool = True,
                   model_id: str | None = None, gpu: str | None = None, source_model: str | None = None,
                   margin: float = DEFAULT_MARGIN) -> SearchResult:
    """The search on given windows (the model-agnostic core; :func:`search` loads model and text)."""
    fingerprints = fingerprints or {"model_sha256": _module_digest(reference), "data_sha256": ""}
    common = dict(model_name=model_name, data_name=data_name, fingerprints=fingerprints, bars=bars, use_cache=use_cache)
    prof, was_cached = cached_profile(reference, profile_windows, weights, choices, calibration=calibration,
                                      weight_profile=weight_profile or joint_weights, **common)
    pred = predictor_from_profile(prof)
    n, heads, hd = prof.layers, prof.kv_heads, prof.head_dim
    per_choice = {c: choice_bytes(c, kv_heads=heads, head_dim=hd) for c in choices}
    tokens_held = batch * context

    qw = quantize_model_weights(reference, weights, calibration, model_key=fingerprints.get("model_sha256"))
    options: list[tuple[Choice, bool]] = [(c, False) for c in choices]
    extra16 = [0.0] * n
    if joint_weights and not weights.is_identity:
        options += [(c, True) for c in choices]
        extra16 = [model_weight_bytes(reference, replace(weights, skip_layers=tuple(sorted({*weights.skip_layers, l})))) - qw.weight_bytes for l in range(n)]
        values = [[pred.alpha_kv * pred.layer_kv(l, c) - (pred.alpha_w * pred.layer_weight_gain(l) if keep else 0.0) for c, keep in options] for l in range(n)]
        costs = [[per_choice[c] * tokens_held + (extra16[l] if keep else 0.0) for c, keep in options] for l in range(n)]
        limit = budget * tokens_held
    else:
        values = [[pred.alpha_kv * pred.layer_kv(l, c) for c, _ in options] for l in range(n)]
        costs = [[per_choice[c] for c, _ in options] for l in range(n)]
        limit = budget
    allocations = candidate_allocations(values, costs, limit, candidates)
    if not allocations:
        raise nothing_fits(budget, n * min(per_choice.values()))
    cands: list[Candidate] = []
    for i, alloc in enumerate(allocations):
        plan = tuple(options[o][0] for o in alloc.options)
        keep = tuple(l for l, o in enumerate(alloc.options) if options[o][1])
        cands.append(Candidate(f"searched plan #{i + 1}", "plan", plan_kvspec(plan, f"plan-{i + 1}"), plan, keep, alloc.method))
    if unaware and not weights.is_identity:
        plain, _ = cached_profile(reference, profile_windows, WeightSpec(), choices, weight_profile=False, **common)
        p0 = predictor_from_profile(plain)
        alloc = allocate_exact([[p0.alpha_kv * p0.layer_kv(l, c) for c in choices] for l in range(n)],
                               [[per_choice[c] for c in choices] for _ in range(n)], budget)
        if alloc is not None:
            plan = tuple(choices[o] for o in alloc.options)
            cands.append(Candidate("KVTuner-style plan (16-bit-weight profile)", "unaware", plan_kvspec(plan, "unaware"), plan, (), alloc.method))
    plan_bytes = lambda plan: _plan_bytes(plan, heads, hd)  # noqa: E731
    cands += baseline_candidates(choices, n, budget, plan_bytes)

    rows = _measure(reference, heldout, qw, weights, cands, calibration, fingerprints, pred, budget, tokens_held, bars, n, heads, hd)
    plans = [r for r in rows if r.kind == "plan" and r.fits]
    chosen = min(plans, key=lambda r: r.kld) if plans else None
    chosen_cand = next((c for c in cands if chosen and c.name == chosen.name), None)
    verdict = _verdict(chosen, rows, margin)
    with_pred = [r for r in rows if r.predicted is not None]
    rho = spearman([r.predicted for r in with_pred], [r.kld for r in with_pred])
    front = pareto_front([Point(r.name, r.total_bytes, r.kld) for r in rows])
    exports: dict = {}
    spec_dict: dict = {}
    if chosen_cand is not None:
        spec = plan_kvspec(chosen_cand.plan)
        spec_dict = spec.to_dict()
        target = model_id or model_name
        desc, source = _describe(reference, source_model, model_name, model_id)
        served = replace(weights, skip_layers=tuple(sorted({*weights.skip_layers, *chosen_cand.keep_16bit})))
        exports = {"wkvlab": spec_dict, **engine_exports(desc, source, served, spec, gpu=gpu, batch=batch, context=context, model_id=model_id)}
        if chosen_cand.keep_16bit:
            # KV flags cannot say it: the checkpoint itself must leave these layers unquantized
            keep = ",".join(map(str, chosen_cand.keep_16bit))
            exports["vllm"]["notes"].append(f"the checkpoint must keep decoder layers {keep} at 16 bits (e.g. llm-compressor ignore=)")
            exports["llama.cpp"]["notes"].append(f"the GGUF must keep decoder layers {keep} at 16 bits (llama-quantize per-tensor types)")
            exports["weights_16bit_layers"] = sorted({*weights.skip_layers, *chosen_cand.keep_16bit})
        exports.update({
            "recipe": layer_recipe(chosen_cand.plan, model=target, weights=weights.label, keep_16bit=chosen_cand.keep_16bit),
        })
    return SearchResult(
        model=model_name, data=data_name, weights=weights.label,
        budget={"bytes_per_token": budget, "source": budget_source or f"{budget:,.0f} B/token (given)", "context": context, "batch": batch,
                "joint_weights": joint_weights},
        formats=[choice_label(c) for c in choices],
        profile={"tokens": prof.tokens, "ctx": prof.ctx, "base_kld": prof.base_kld, "seconds": prof.seconds, "cached": was_cached},
        predictor={"alpha_kv": pred.alpha_kv, "alpha_w": pred.alpha_w},
        rows=rows, chosen=chosen, verdict=verdict, rank_correlation=rho,
        pareto=[p.name for p in front],
        plan=[choice_label(c) for c in chosen_cand.plan] if chosen_cand else [],
        keep_16bit=list(chosen_cand.keep_16bit) if chosen_cand else [],
        spec=spec_dict, exports=exports, heldout_tokens=heldout.n_scored,
    )


def _describe(reference: torch.nn.Module, source_model: str | None, name: str, model_id: str | None):
    """The planner's description of the searched model and where its checkpoint is (for the launch lines)."""
    from wkvlab.plan.models import ModelDescription
    from wkvlab.plan.source import ModelSource, resolve_source

    if source_model is not None:
        try:
            return resolve_source(source_model)
        except ConfigError:
            pass  # a model the planner cannot describe by name: fall back to the loaded config
    desc = ModelDescription.from_config(reference.config.to_dict(), name=name)
    return desc, ModelSource(name, "description", hub_id=model_id or "")


def _module_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().cpu().numpy().tobytes()[:4096])
    return digest.hexdigest()


def _measure(reference, heldout: WindowSet, qw, weights: WeightSpec, cands: list[Candidate], calibration, fingerprints,
             pred: Predictor, budget: float, tokens_held: int, bars: Bars, n: int, heads: int, hd: int) -> list[Row]:
    scorer = Scorer(reference, heldout)
    rows = []
    built = {(): qw}
    with bars("held-out evaluation", len(cands)) as tick:
        for cand in cands:
            if cand.keep_16bit not in built:
                skip = tuple(sorted({*weights.skip_layers, *cand.keep_16bit}))
                built[cand.keep_16bit] = quantize_model_weights(reference, replace(weights, skip_layers=skip), calibration,
                                                                model_key=fingerprints.get("model_sha256"))
            model = built[cand.keep_16bit]
            score = scorer.score(model.model, cand.spec)
            kv_bytes = cand.spec.bytes_per_token(layers=n, kv_heads=heads, head_dim=hd)
            total = model.weight_bytes + kv_bytes * tokens_held
            fits = (total <= qw.weight_bytes + budget * tokens_held + 1e-6) if cand.keep_16bit else kv_bytes <= budget + 1e-9
            predicted = pred.predict(cand.plan, cand.keep_16bit) if cand.plan is not None else None
            rows.append(Row(cand.name, cand.kind, cand.spec.canonical() if not cand.spec.layers else "per-layer map", kv_bytes,
                            model.weight_bytes, total, fits, predicted, score.kld, score.se, cand.method,
                            [f"weights 16-bit in layers {list(cand.keep_16bit)}"] if cand.keep_16bit else [], score))
            tick(cand.name, 1)
            if cand.keep_16bit:  # keep memory flat: at most one extra weight copy at a time
                built.pop(cand.keep_16bit)
    return rows


def _verdict(chosen: Row | None, rows: list[Row], margin: float = DEFAULT_MARGIN) -> str:
    """The chosen plan against the best fitting uniform format and the other baselines, paired by window.

    Each difference is decided by the one rule (wkvlab.stats.decide): m = ``margin`` × the rival's KLD,
    the comparisons of one search one Holm family."""
    fitting = [r for r in rows if r.kind == "uniform" and r.fits]
    if chosen is None:
        return "no searched plan fits the budget"
    rivals: list[tuple[str, Row]] = []
    if fitting:
        best = min(fitting, key=lambda r: r.kld)
        rivals.append((f"best fitting uniform {best.name}", best))
    rivals += [(r.name, r) for r in rows if r.fits and r.kind in ("unaware", "skip-ends", "sinks")]
    draws = [paired_draws(chosen.score, r.score) if chosen.score is not None and r.score is not None else None for _, r in rivals]
    effects = [Effect(f"plan − {name}", d, Margin.relative_to(r.kld, f"KLD of {name}", margin), chosen.score.tokens, SEARCH_WORDS)
               for (name, r), d in zip(rivals, draws) if d is not None]
    verdicts = iter(decide(effects, family=f"plan vs {len(effects)} baseline{'s' if len(effects) != 1 else ''}"))
    text = f"plan held-out KLD {chosen.kld:.5f}"
    if not fitting:
        text += "; no uniform format fits the budget"
    for (name, rival), d in zip(rivals, draws):
        if d is None:
            text += f"; minus {name} ({rival.kld:.5f}): {chosen.kld - rival.kld:+.5f} (no paired interval)"
            continue
        v = next(verdicts)
        need = v.need()
        text += (f"; minus {name} ({rival.kld:.5f}): {format(v.raw, '+.5f')} → {v.word} (m ±{v.margin.value:.2g}, "
                 f"{100 * v.margin.relative:g}% of its KLD; {v.adjustment})" + (f", {need}" if need else ""))
    return text


SEARCH_WORDS = ("worse (higher KLD)", "better (lower KLD)", "equivalent within ±m")


def search(model: str | LoadedModel = "default", data: str = "default", *, budget: float | None = None, gpu: str | None = None,
           batch: int = 1, context: int | None = None, weights: str = "int4-g128", formats: str | None = None, ctx: int = 256,
           profile_tokens: int = 256, heldout_tokens: int = 512, candidates: int = 4, joint_weights: bool = False,
           unaware: bool = True, weight_profile: bool = True, calibration: CalibrationSpec | None = None,
           bars: Bars = _no_bars, use_cache: bool = True, margin: float = DEFAULT_MARGIN) -> SearchResult:
    """Find the per-layer KV assignment (and, with ``joint_weights``, 16-bit weight layers) that minimizes
    measured KLD under a budget of ``budget`` bytes/token, or what ``gpu`` leaves at ``batch`` x ``context``."""
    check_budget_options(budget, gpu, batch, context)
    spec, choices = WeightSpec.parse(weights), parse_choices(formats)
    sd = prepare_search(model, data, ctx=ctx, profile_tokens=profile_tokens, heldout_tokens=heldout_tokens)
    context = context or min(8192, sd.loaded.max_context)
    calib = _calibration(sd, spec, calibration)
    source = ""
    if gpu is not None:
        weight_bytes = model_weight_bytes(sd.loaded.model, spec)
        info = gpu_budget(sd.loaded.model, sd.loaded.name, gpu, weight_bytes, batch, context)
        budget, source = info["bytes_per_token"], info["source"]
    return search_windows(sd.loaded.model, sd.profile, sd.heldout, spec, choices, float(budget), model_name=sd.loaded.name,
                          data_name=sd.corpus.name, fingerprints=_fingerprints(sd), calibration=calib, context=context, batch=batch,
                          candidates=candidates, joint_weights=joint_weights, unaware=unaware, weight_profile=weight_profile,
                          budget_source=source, bars=bars, use_cache=use_cache, gpu=gpu,
                          source_model=model if isinstance(model, str) else None, margin=margin)
