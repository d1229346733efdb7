"""Profile and search as Python functions; ``wkvlab profile``/``wkvlab search`` only parse and print.

    >>> from wkvlab.search import api
    >>> result = api.search(model="default", budget=9000, weights="int4-g128")
    >>> result.chosen.name, result.verdict

Text: profiling windows are cut from the start of the corpus, held-out windows right after them
(never overlapping), calibration samples (GPTQ/AWQ weights only) from its end.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager

import numpy as np
import torch

from wkvlab.data import Corpus, WindowSet, load_corpus, make_windows, tokenize, tokenizer_wants_bos
from wkvlab.errors import ConfigError, DataError
from wkvlab.models.loading import LoadedModel, cache_dir, load_model
from wkvlab.search.allocate import candidate_allocations, allocate_exact
from wkvlab.search.baselines import (UNIFORM_TOLERANCE, Candidate, at_budget, budget_step, fill_to_budget, greedy_mix,
                                     random_mixes as random_mixes_at, uniform_at_budget, uniform_plan)
from wkvlab.search.kvtuner import SOURCE as KVTUNER_SOURCE, kvtuner_rule
from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, Choice, check_budget_options, choice_bytes, choice_label, nothing_fits, parse_choices
from wkvlab.search.export import engine_exports, layer_recipe, plan_kvspec
from wkvlab.search.measure import Score, Scorer, paired_draws
from wkvlab.search.pareto import Point, pareto_front
from wkvlab.search.predict import Predictor, predictor_from_profile, spearman
from wkvlab.search.profile import SensitivityProfile, collect_profile, profile_key, profile_steps
from wkvlab.stats.decision import DEFAULT_MARGIN, MarginRule, Verdict, decide
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
#
# Every rival is built for one budget and spends it (issue #24 item 6): per-layer mixes within one
# layer-format step under it (:func:`~wkvlab.search.baselines.fill_to_budget`), a uniform format only
# within ±2% of it. With several budgets (a Pareto curve) each budget gets its own plan and rivals and
# every difference of every budget is one Holm family.

RANDOM_MIXES = 5
SEARCH_WORDS = ("worse (higher KLD)", "better (lower KLD)", "equivalent within ±m")
RIVALS = ("greedy", "unaware", "kvtuner", "random", "uniform")


@dataclass
class Row:
    name: str
    kind: str  # plan | greedy | unaware | kvtuner | random | uniform | reference
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
    budget: float = math.nan  # the budget the row was built for (NaN: the fp16 reference)
    gap: float = math.nan  # budget − bytes per token spent (16-bit weight layers counted per token of batch x context)
    at_budget: bool = False  # spends the budget within one layer-format step
    plan: list = field(default_factory=list)  # per-layer choice labels
    score: Score | None = field(default=None, repr=False, compare=False)  # per-token KLD, for paired intervals

    @property
    def key(self) -> str:
        """Unique among a result's rows: the name, and the budget it was built for."""
        return self.name if math.isnan(self.budget) else f"{self.name} @ {self.budget:,.0f}"

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "score"}, "key": self.key}


@dataclass
class Comparison:
    """The chosen plan of one budget against one kind of rival (random: the mean of the mixes)."""

    rival: str  # one of RIVALS
    label: str
    kld: float
    bytes: tuple  # (least, most) bytes per token the rival's rows spend
    gap: tuple  # (least, most) gap to the budget
    verdict: Verdict | None

    def to_dict(self) -> dict:
        return {"rival": self.rival, "label": self.label, "kld": self.kld, "bytes": list(self.bytes), "gap": list(self.gap),
                "verdict": self.verdict.to_dict() if self.verdict is not None else None}


@dataclass
class BudgetPoint:
    budget: float
    step: float  # one layer-format step (B/token): a rival is at the budget within it
    chosen: str  # the plan row's name ("" when none fits)
    kld: float
    bytes_per_token: float
    comparisons: list
    uniform: str = ""  # the uniform format within ±2% ("" when none)
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "comparisons"}, "comparisons": [c.to_dict() for c in self.comparisons]}


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
    chosen: Row | None  # one budget: the chosen plan (a curve: None; see points)
    verdict: str
    rank_correlation: float
    pareto: list  # row keys on the front
    plan: list  # per-layer choice labels of the chosen plan
    keep_16bit: list
    spec: dict  # KVSpec.to_dict() of the chosen plan
    exports: dict
    heldout_tokens: int
    points: list = field(default_factory=list)  # BudgetPoint per budget
    family: str = ""
    random_mixes: int = RANDOM_MIXES

    @property
    def is_curve(self) -> bool:
        return len(self.points) > 1

    def to_dict(self) -> dict:
        data = dict(self.__dict__)
        data["rows"] = [r.to_dict() for r in self.rows]
        data["chosen"] = self.chosen.to_dict() if self.chosen else None
        data["points"] = [p.to_dict() for p in self.points]
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


def plan_candidates(values: list[list[float]], costs: list[list[float]], options: list[tuple[Choice, bool]], budget: float,
                    scale: float = 1.0, candidates: int = 1) -> list[Candidate]:
    """The searched plans at one budget (DP optimum first, then greedy's and DP optima a little under the budget),
    each filled to the budget; ``options[o]`` = (KV choice, weights kept 16-bit), ``costs`` in units of ``scale`` x B/token."""
    found: dict[tuple, str] = {}
    for alloc in candidate_allocations(values, costs, budget * scale, max(candidates, 1)):
        found.setdefault(fill_to_budget(alloc.options, costs, budget * scale, values), alloc.method)
        if len(found) == candidates:
            break
    out = []
    for i, (picks, method) in enumerate(found.items()):
        plan = tuple(options[o][0] for o in picks)
        keep = tuple(l for l, o in enumerate(picks) if options[o][1])
        name = "searched plan" if len(found) == 1 else f"searched plan #{i + 1}"
        out.append(Candidate(name, "plan", plan_kvspec(plan, "plan"), plan, keep, f"{method}, filled to the budget", budget=budget))
    return out


def rival_candidates(choices: tuple[Choice, ...], per_choice: dict, n: int, budget: float, aware_values: list[list[float]],
                     unaware_values: list[list[float]] | None = None, *, kvtuner_values: list[list[float]] | None = None,
                     kvtuner_profile: str = "16-bit-weight", random_mixes: int = RANDOM_MIXES) -> tuple[list[Candidate], list[str], str]:
    """The rivals at one budget, every one spending it (KV bytes only): the greedy mix on the weight-aware values,
    the weight-unaware plan, KVTuner's rule, random mixes, a uniform format within ±2%. Returns (candidates, notes,
    the uniform's label or "")."""
    costs = [[per_choice[c] for c in choices] for _ in range(n)]
    fp16_bytes = per_choice[FP16] * n
    if budget >= fp16_bytes - 1e-9:
        return [], [f"the budget is at or above the whole 16-bit cache ({fp16_bytes:,.0f} B/token): every KV mix fits, no rival spends it"], ""
    rivals = [("greedy mix (weight-aware profile)", "greedy", greedy_mix(aware_values, costs, budget), "greedy, filled to the budget")]
    if unaware_values is not None:
        alloc = allocate_exact(unaware_values, costs, budget)
        rivals.append(("weight-unaware plan (16-bit-weight profile)", "unaware", fill_to_budget(alloc.options, costs, budget, unaware_values),
                       f"{alloc.method} on the 16-bit-weight profile, filled to the budget"))
    if kvtuner_values is not None:
        rule = kvtuner_rule(kvtuner_values, costs, budget, tuple(i for i, c in enumerate(choices) if c != FP16))
        if rule is not None:
            rivals.append((f"KVTuner rule, approx. ({kvtuner_profile} profile)", "kvtuner", rule.options,
                           f"{len(rule.groups)} layer groups, pruned pairs, exact on predicted KLD ({KVTUNER_SOURCE}), filled to the budget"))
    for r, picks in enumerate(random_mixes_at(costs, budget, random_mixes, seed=int(round(budget))) if random_mixes else []):
        rivals.append((f"random mix {r + 1}", "random", picks, "random moves up from the cheapest, filled to the budget"))
    notes, label = [], ""
    uni = uniform_at_budget(choices, n, budget, lambda plan: _plan_bytes_of(plan, per_choice))
    if uni is not None:
        label = choice_label(uni)
        rivals.append((f"uniform {label}", "uniform", tuple([choices.index(uni)] * n), "every layer the same"))
    else:
        near = min((c for c in choices if c != FP16), key=lambda c: abs(per_choice[c] * n - budget))
        notes.append(f"no uniform format within ±{100 * UNIFORM_TOLERANCE:g}% of the budget (nearest: {choice_label(near)}, "
                     f"{per_choice[near] * n:,.0f} B/token, {100 * (per_choice[near] * n / budget - 1):+.1f}%)")
    out = []
    for name, kind, picks, method in rivals:
        plan = tuple(choices[o] for o in picks)
        out.append(Candidate(name, kind, plan_kvspec(plan, kind), plan, (), method, budget=budget))
    return out, notes, label


def _plan_bytes_of(plan, per_choice: dict) -> float:
    return float(sum(per_choice[c] for c in plan))


def _budgets(budget) -> list[float]:
    values = [float(b) for b in (budget if isinstance(budget, (list, tuple)) else [budget])]
    if not values or any(not (b > 0 and math.isfinite(b)) for b in values):
        raise ConfigError(f"budgets must be positive numbers of bytes per token, got {values}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--budgets lists a budget twice: {values}")
    return sorted(values)


def search_windows(reference: torch.nn.Module, profile_windows: WindowSet, heldout: WindowSet, weights: WeightSpec,
                   choices: tuple[Choice, ...], budget: float | list[float], *, model_name: str = "model", data_name: str = "text",
                   fingerprints: dict | None = None, calibration: CalibrationSet | None = None, context: int = 8192,
                   batch: int = 1, candidates: int = 1, joint_weights: bool = False, unaware: bool = True, kvtuner: bool = True,
                   random_mixes: int = RANDOM_MIXES, weight_profile: bool = True, budget_source: str = "", bars: Bars = _no_bars,
                   use_cache: bool = True, model_id: str | None = None, gpu: str | None = None, source_model: str | None = None,
                   margin: float = DEFAULT_MARGIN) -> SearchResult:
    """The search on given windows (the model-agnostic core; :func:`search` loads model and text).

    ``budget``: bytes per token, or a list of them (a Pareto curve: a plan and its rivals at each)."""
    budgets = _budgets(budget)
    if candidates < 1 or random_mixes < 0:
        raise ConfigError(f"--candidates must be ≥ 1 and --random ≥ 0, got {candidates} and {random_mixes}")
    fingerprints = fingerprints or {"model_sha256": _module_digest(reference), "data_sha256": ""}
    common = dict(model_name=model_name, data_name=data_name, fingerprints=fingerprints, bars=bars, use_cache=use_cache)
    prof, was_cached = cached_profile(reference, profile_windows, weights, choices, calibration=calibration,
                                      weight_profile=weight_profile or joint_weights, **common)
    pred = predictor_from_profile(prof)
    n, heads, hd = prof.layers, prof.kv_heads, prof.head_dim
    per_choice = {c: choice_bytes(c, kv_heads=heads, head_dim=hd) for c in choices}
    tokens_held = batch * context
    kv_costs = [[per_choice[c] for c in choices] for _ in range(n)]
    kv_values = [[pred.alpha_kv * pred.layer_kv(l, c) for c in choices] for l in range(n)]
    step, fp16_bytes = budget_step(kv_costs), per_choice[FP16] * n
    if budgets[0] < n * min(per_choice.values()) - 1e-9:
        raise nothing_fits(budgets[0], n * min(per_choice.values()))

    qw = quantize_model_weights(reference, weights, calibration, model_key=fingerprints.get("model_sha256"))
    options: list[tuple[Choice, bool]] = [(c, False) for c in choices]
    values, costs, scale = kv_values, kv_costs, 1.0
    if joint_weights and not weights.is_identity:
        options += [(c, True) for c in choices]
        extra16 = [model_weight_bytes(reference, replace(weights, skip_layers=tuple(sorted({*weights.skip_layers, l})))) - qw.weight_bytes for l in range(n)]
        values = [[pred.alpha_kv * pred.layer_kv(l, c) - (pred.alpha_w * pred.layer_weight_gain(l) if keep else 0.0) for c, keep in options] for l in range(n)]
        costs = [[per_choice[c] * tokens_held + (extra16[l] if keep else 0.0) for c, keep in options] for l in range(n)]
        scale = tokens_held
    second = None  # the 16-bit-weight profile's predictor: the weight-unaware plan's, and KVTuner's when there is one
    if unaware and not weights.is_identity:
        plain, _ = cached_profile(reference, profile_windows, WeightSpec(), choices, weight_profile=False, **common)
        second = predictor_from_profile(plain)
    kv_of = lambda p: [[p.alpha_kv * p.layer_kv(l, c) for c in choices] for l in range(n)]  # noqa: E731

    cands: list[Candidate] = [Candidate("uniform fp16 (cache untouched)", "reference", KVSpec(), uniform_plan(FP16, n))]
    notes: dict[float, list[str]] = {}
    uniform_of: dict[float, str] = {}
    which = "weight-aware" if second is None and not weights.is_identity else "16-bit-weight"
    for b in budgets:
        cands += plan_candidates(values, costs, options, b, scale, candidates)
        rivals, notes[b], uni = rival_candidates(choices, per_choice, n, b, kv_values, kv_of(second) if second is not None else None,
                                                 kvtuner_values=kv_of(second if second is not None else pred) if kvtuner else None,
                                                 kvtuner_profile=which, random_mixes=random_mixes)
        cands += rivals
        if uni:
            uniform_of[b] = uni
    rows = _measure(reference, heldout, qw, weights, cands, calibration, fingerprints, pred, tokens_held, bars, n, heads, hd, step)
    points, family = _decide(rows, budgets, step, uniform_of, notes, margin)
    single = len(budgets) == 1
    chosen = next((r for r in rows if single and r.name == points[0].chosen and r.kind == "plan"), None)
    chosen_cand = next((c for c in cands if chosen and c.kind == "plan" and c.name == chosen.name), None)
    with_pred = [r for r in rows if r.predicted is not None]
    rho = spearman([r.predicted for r in with_pred], [r.kld for r in with_pred])
    front = pareto_front([Point(r.key, r.total_bytes, r.kld) for r in rows])
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
    verdict = _verdict_text(points[0]) if single else _curve_text(points, family)
    return SearchResult(
        model=model_name, data=data_name, weights=weights.label,
        budget={"bytes_per_token": budgets[0] if single else None, "budgets": budgets,
                "source": budget_source or (f"{budgets[0]:,.0f} B/token (given)" if single else f"{len(budgets)} budgets (given)"),
                "context": context, "batch": batch, "joint_weights": joint_weights, "step": step, "fp16_bytes_per_token": fp16_bytes},
        formats=[choice_label(c) for c in choices],
        profile={"tokens": prof.tokens, "ctx": prof.ctx, "base_kld": prof.base_kld, "seconds": prof.seconds, "cached": was_cached},
        predictor={"alpha_kv": pred.alpha_kv, "alpha_w": pred.alpha_w},
        rows=rows, chosen=chosen, verdict=verdict, rank_correlation=rho,
        pareto=[p.name for p in front],
        plan=[choice_label(c) for c in chosen_cand.plan] if chosen_cand else [],
        keep_16bit=list(chosen_cand.keep_16bit) if chosen_cand else [],
        spec=spec_dict, exports=exports, heldout_tokens=heldout.n_scored, points=points, family=family, random_mixes=random_mixes,
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
             pred: Predictor, tokens_held: int, bars: Bars, n: int, heads: int, hd: int, step: float) -> list[Row]:
    """Every candidate on the held-out windows; a plan built twice (two rivals that agree) is scored once."""
    scorer = Scorer(reference, heldout)
    rows = []
    built = {(): qw}
    scored: dict[tuple, Score] = {}
    with bars("held-out evaluation", len({(c.plan, c.keep_16bit) for c in cands})) as tick:
        for i, cand in enumerate(cands):
            if cand.keep_16bit not in built:
                skip = tuple(sorted({*weights.skip_layers, *cand.keep_16bit}))
                built[cand.keep_16bit] = quantize_model_weights(reference, replace(weights, skip_layers=skip), calibration,
                                                                model_key=fingerprints.get("model_sha256"))
            model = built[cand.keep_16bit]
            key = (cand.plan, cand.keep_16bit)
            if key not in scored:
                scored[key] = scorer.score(model.model, cand.spec)
                tick(cand.name, 1)
            score = scored[key]
            kv_bytes = cand.spec.bytes_per_token(layers=n, kv_heads=heads, head_dim=hd)
            total = model.weight_bytes + kv_bytes * tokens_held
            spent = kv_bytes + (model.weight_bytes - qw.weight_bytes) / tokens_held  # B/token, 16-bit weight layers included
            fits = math.isnan(cand.budget) or spent <= cand.budget + 1e-6
            gap = cand.budget - spent
            predicted = pred.predict(cand.plan, cand.keep_16bit) if cand.plan is not None else None
            rows.append(Row(cand.name, cand.kind, cand.spec.canonical() if not cand.spec.layers else "per-layer map", kv_bytes,
                            model.weight_bytes, total, fits, predicted, score.kld, score.se, cand.method,
                            [f"weights 16-bit in layers {list(cand.keep_16bit)}"] if cand.keep_16bit else [],
                            cand.budget, gap, not math.isnan(gap) and at_budget(spent, cand.budget, step),
                            [choice_label(c) for c in cand.plan] if cand.plan is not None else [], score))
            if cand.keep_16bit and all(c.keep_16bit != cand.keep_16bit for c in cands[i + 1:]):
                built.pop(cand.keep_16bit)  # keep memory flat: at most one extra weight copy at a time
    return rows


def _mean_score(scores: list[Score]) -> Score:
    """The per-token mean of several scores on the same windows (the random mixes as one rival)."""
    if len(scores) == 1:
        return scores[0]
    per = np.mean([s.per_token for s in scores], axis=0)
    se = float(per.std(ddof=1) / np.sqrt(per.size)) if per.size > 1 else math.nan
    return Score(float(per.mean()), se, int(per.size), per, scores[0].windows)


def rival_label(kind: str, rows: list[Row]) -> str:
    return f"mean of {len(rows)} random mixes" if kind == "random" else rows[0].name


def _decide(rows: list[Row], budgets: list[float], step: float, uniform_of: dict, notes: dict,
            margin: float) -> tuple[list[BudgetPoint], str]:
    """Per budget the best plan against each kind of rival; every difference of every budget one Holm family."""
    points, effects, where = [], [], []
    for b in budgets:
        mine = [r for r in rows if r.budget == b]
        plans = [r for r in mine if r.kind == "plan" and r.fits]
        chosen = min(plans, key=lambda r: r.kld) if plans else None
        comps = []
        for kind in RIVALS:
            members = [r for r in mine if r.kind == kind]
            if not members or chosen is None:
                continue
            score = _mean_score([r.score for r in members])
            label = rival_label(kind, members)
            spent = [r.kv_bytes_per_token for r in members]
            gaps = [r.gap for r in members]
            comps.append(Comparison(kind, label, score.kld, (min(spent), max(spent)), (min(gaps), max(gaps)), None))
            draws = paired_draws(chosen.score, score)
            if draws is not None:
                where.append((len(points), len(comps) - 1))
                rival = paired_draws(score)  # the rival's own KLD on the same windows: the margin's basis
                effects.append(MarginRule.parse(margin).difference_effect(f"{b:,.0f} B/token: plan − {label}", draws, rival,
                                                                          f"KLD of {label}", chosen.score.tokens, unit="nats", words=SEARCH_WORDS))
        points.append(BudgetPoint(b, step, chosen.name if chosen else "", chosen.kld if chosen else math.nan,
                                  chosen.kv_bytes_per_token if chosen else math.nan, comps, uniform_of.get(b, ""), notes.get(b, [])))
    family = (f"plan vs its rivals at equal memory: {len(effects)} difference{'s' if len(effects) != 1 else ''}"
              + (f" over {len(budgets)} budgets" if len(budgets) > 1 else ""))
    for (p, c), v in zip(where, decide(effects, family=family)):
        points[p].comparisons[c].verdict = v
    return points, family


def _verdict_text(point: BudgetPoint) -> str:
    """One budget's verdicts in a line: each ``plan − rival`` difference through the one decision rule."""
    if not point.chosen:
        return "no searched plan fits the budget"
    text = f"plan held-out KLD {point.kld:.5f} at {point.bytes_per_token:,.0f} B/token (budget {point.budget:,.0f})"
    for c in point.comparisons:
        v = c.verdict
        if v is None:
            text += f"; minus {c.label} ({c.kld:.5f}): {point.kld - c.kld:+.5f} (no paired interval)"
            continue
        need = v.need()
        text += (f"; minus {c.label} ({c.kld:.5f}): {format(v.raw, '+.5f')} → {v.word} (m ±{v.margin.value:.2g}, "
                 + ("stated" if v.margin.stated else f"{100 * v.margin.relative:g}% of its KLD") + f"; {v.adjustment})" + (f", {need}" if need else ""))
    for note in point.notes:
        text += f"; {note}"
    return text


def _curve_text(points: list[BudgetPoint], family: str) -> str:
    """A curve's verdicts counted by outcome (the table has each)."""
    verdicts = [c.verdict for p in points for c in p.comparisons if c.verdict is not None]
    counts = {w: sum(v.outcome == o for v in verdicts) for o, w in zip(("below", "above", "within", "undecided"),
                                                                         ("better", "worse", "equivalent", "undecided"))}
    if not verdicts:
        return f"over {len(points)} budgets: no paired comparison"
    m = verdicts[0].margin
    rule = f"margin ±{m.value:.3g} nats, stated" if m.stated else f"margin m = {100 * m.relative:g}% of each rival's KLD"
    return (f"over {len(points)} budgets the plan is better in {counts['better']}, worse in {counts['worse']}, equivalent in "
            f"{counts['equivalent']} and undecided in {counts['undecided']} of {len(verdicts)} comparisons "
            f"({rule}; Holm over {len(verdicts)} tests)")


def search(model: str | LoadedModel = "default", data: str = "default", *, budget: float | None = None, gpu: str | None = None,
           budgets: list[float] | None = None, batch: int = 1, context: int | None = None, weights: str = "int4-g128",
           formats: str | None = None, ctx: int = 256, profile_tokens: int = 256, heldout_tokens: int = 2048, candidates: int = 1,
           joint_weights: bool = False, unaware: bool = True, kvtuner: bool = True, random_mixes: int = RANDOM_MIXES,
           weight_profile: bool = True, calibration: CalibrationSpec | None = None, bars: Bars = _no_bars, use_cache: bool = True,
           margin: float = DEFAULT_MARGIN) -> SearchResult:
    """Find the per-layer KV assignment (and, with ``joint_weights``, 16-bit weight layers) that minimizes
    measured KLD under a budget of ``budget`` bytes/token (or each of ``budgets``: a Pareto curve), or what
    ``gpu`` leaves at ``batch`` x ``context``; every rival spends the same budget."""
    check_budget_options(budget, gpu, batch, context, budgets)
    spec, choices = WeightSpec.parse(weights), parse_choices(formats)
    sd = prepare_search(model, data, ctx=ctx, profile_tokens=profile_tokens, heldout_tokens=heldout_tokens)
    context = context or min(8192, sd.loaded.max_context)
    calib = _calibration(sd, spec, calibration)
    source = ""
    target: float | list[float] = list(budgets) if budgets else budget  # type: ignore[assignment]
    if gpu is not None:
        weight_bytes = model_weight_bytes(sd.loaded.model, spec)
        info = gpu_budget(sd.loaded.model, sd.loaded.name, gpu, weight_bytes, batch, context)
        target, source = info["bytes_per_token"], info["source"]
    return search_windows(sd.loaded.model, sd.profile, sd.heldout, spec, choices, target, model_name=sd.loaded.name,
                          data_name=sd.corpus.name, fingerprints=_fingerprints(sd), calibration=calib, context=context, batch=batch,
                          candidates=candidates, joint_weights=joint_weights, unaware=unaware, kvtuner=kvtuner,
                          random_mixes=random_mixes, weight_profile=weight_profile, budget_source=source, bars=bars,
                          use_cache=use_cache, gpu=gpu, source_model=model if isinstance(model, str) else None, margin=margin)
