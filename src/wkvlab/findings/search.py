"""The search finding: does a weight-aware per-layer KV plan beat a weight-unaware one, and the
per-layer mixes and uniform formats that spend the same memory?

The search (:mod:`wkvlab.search`) allocates per-layer K/V formats under a byte budget from a
sensitivity profile. Weight-aware: the profile is measured with the quantized weights in place;
weight-unaware (KVTuner-style profile, the same allocator): with 16-bit weights, then shipped under
the quantized weights. Every comparison is made **at equal memory** (issue #24 item 6):

* a Pareto curve over the grid's budgets (≥ 8 shares of the 16-bit cache's bytes per token);
* at each budget every per-layer plan spends the budget within one layer-format step
  (:func:`wkvlab.search.baselines.fill_to_budget`): the aware and unaware DP plans, the greedy
  allocator's mix on the same aware profile, and random mixes;
* a uniform format is compared only where its bytes are within ±``uniform_tolerance`` of the budget,
  else the row says "no uniform at this budget" — never a uniform that spends less;
* KVTuner's own rule (Li et al., ICML 2025: intra-layer pair pruning, inter-layer grouping, a
  search over the groups), approximated on each replicate's 16-bit-weight profile
  (:mod:`wkvlab.search.kvtuner`: its pruning and grouping code is unpublished, the rest follows
  github.com/cmd2001/KVTuner@babe775 ``search_optuna_adaptive.py``) and filled to the budget;
* the held-out windows are **spread over documents** — one window from each of the first documents
  of the text that hold one (:func:`wkvlab.data.windows.make_document_windows`), the same windows
  for every plan — and the **document** is the unit: each plan's held-out KLD is averaged per
  document, because windows of one document share its difficulty (16 consecutive windows of a
  stream come from a handful of documents, and resampling them as independent units under-covers:
  issue #38 simulated 16 windows from 4 documents and the 95% interval missed 17.8–23.2%);
* the profile is replicated: ``replicates`` (≥ 5) profiles per profile text, each on its own
  disjoint windows cut from the documents no held-out window touches, each giving its own plans.
  Differences are decided from the two-stage (profile × document) interval
  (:func:`wkvlab.stats.twostage.two_stage`, analytic), so the profile's own variation is in every interval;
  random mix *r* is paired with replicate *r*;
* a rival whose plans are the aware plans in every replicate (the greedy mix often is; every plan at
  the smallest budget is) is **not tested**: its difference is exactly 0, which says the two
  procedures chose the same plan, not that two different plans are equivalent. The row says
  "same plans", and "equivalent" is only ever counted on distinct plans;
* the predictor's rank correlation (Spearman of predicted vs held-out KLD over the distinct plans)
  is printed next to the same plans ranked by their bytes alone: at equal-memory budgets a plan's
  bytes already order most of them, and only the gap between the two is the profile's contribution.

Every verdict goes through the one decision rule (:func:`wkvlab.stats.decision.decide`: margin,
Holm over the finding's family). Profiles and held-out scores are cached on disk by content, so an
interrupted run resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from wkvlab.stats import Interval

Tick = Callable[[str, float], None]

# 1: one profile per text, "best fitting uniform" at or under the budget (unequal memory); 2: held-out windows of a stream,
# resampled as windows; 3: held-out windows spread over documents, resampled by document, identical plans not tested
VERSION = 3
RIVALS = ("unaware", "kvtuner", "greedy", "random", "uniform")


@dataclass(frozen=True)
class SearchGrid:
    """What the finding measures on one model (``sizes`` in :mod:`wkvlab.findings.grids`)."""

    weights: str = "int4-g128"
    formats: str = "K8V8,K8V4,K4V4,K4V2"
    profile_texts: tuple = ("default", "code")
    heldout_texts: tuple = ("default", "code")
    # shares of the 16-bit cache's bytes per token: K4V2 … K8V8 on SmolLM2-135M are 22% / 28% / 40% / 52%
    budgets: tuple = (0.22, 0.25, 0.28, 0.31, 0.34, 0.37, 0.40, 0.44, 0.48, 0.52)
    replicates: int = 5  # profiles per profile text, on disjoint windows
    uniform_tolerance: float = 0.02  # a uniform format is at a budget within ±2% of it
    ctx: int = 256
    profile_tokens: int = 1024  # per replicate
    heldout_tokens: int = 4096


@dataclass(frozen=True)
class PlanRow:
    """One (profile text, budget, held-out text): the aware plans against every rival at that budget.

    KLDs are means over the replicates; ``differences[k]`` is aware − rival ``k`` (two-stage interval),
    ``bytes[k]`` the (least, most) bytes per token the rival's plans spend; ``step`` one layer-format step."""

    profile_text: str
    budget: float  # bytes per token
    share: float  # of the 16-bit cache
    heldout_text: str
    aware: float
    unaware: float
    uniform_name: str  # "" when no uniform is at this budget
    uniform: float
    tokens: int
    replicates: int = 0
    greedy: float = float("nan")
    random: float = float("nan")
    step: float = 0.0
    kvtuner: float = float("nan")  # KVTuner's rule (approximate), absent from findings stored before it
    bytes: dict = field(default_factory=dict)
    differences: dict = field(default_factory=dict)  # rival -> Interval
    verdicts: dict = field(default_factory=dict)  # rival -> Verdict (the one rule, Holm over the finding)
    identical: tuple = ()  # rivals whose plans are the aware ones in every replicate: no test (a zero is no evidence)
    per_document: dict = field(default_factory=dict)  # kind -> [replicate][document] mean held-out KLD (re-decidable)

    @property
    def aware_minus_unaware(self) -> Interval | None:
        return self.differences.get("unaware")

    @property
    def aware_minus_uniform(self) -> Interval | None:
        return self.differences.get("uniform")

    def to_dict(self) -> dict:
        plain = ("profile_text", "budget", "share", "heldout_text", "aware", "unaware", "uniform_name", "uniform", "tokens",
                 "replicates", "greedy", "random", "step", "kvtuner")
        diffs = {k: v.to_dict() for k, v in self.differences.items()}
        return {**{k: getattr(self, k) for k in plain}, "bytes": {k: list(v) for k, v in self.bytes.items()},
                "differences": diffs, "aware_minus_unaware": diffs.get("unaware"), "aware_minus_uniform": diffs.get("uniform"),
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()}, "identical": list(self.identical),
                "per_document": self.per_document}


@dataclass
class SearchFinding:
    rows: list[PlanRow]
    rank_correlation: dict  # "profile text -> held-out text" -> Spearman of predicted vs held-out KLD (replicate 0, distinct plans)
    layer_agreement: dict  # format -> Spearman of two profiles' per-layer deltas (weight-aware)
    plans: dict  # "profile text / replicate / kind / share" -> per-layer choice labels
    profile_seconds: dict = field(default_factory=dict)
    curve: dict = field(default_factory=dict)  # "profile text -> held-out text" -> points (name, kind, share, bytes, kld, front)
    agreement_between: str = ""
    bytes_rank_correlation: dict = field(default_factory=dict)  # the same plans ranked by their bytes alone (more bytes, lower KLD)
    distinct_plans: dict = field(default_factory=dict)  # how many distinct plans each correlation ranks

    def to_dict(self) -> dict:
        return {"version": VERSION, "rows": [r.to_dict() for r in self.rows], "rank_correlation": self.rank_correlation,
                "bytes_rank_correlation": self.bytes_rank_correlation, "distinct_plans": self.distinct_plans,
                "layer_agreement": self.layer_agreement, "agreement_between": self.agreement_between, "plans": self.plans,
                "profile_seconds": self.profile_seconds, "curve": self.curve}


def search_steps(grid: SearchGrid, n_layers: int) -> int:
    """Progress steps: the profiles' passes and the held-out scores (a cached profile or score counts as done)."""
    from wkvlab.search.choices import FP16, parse_choices

    choices = parse_choices(grid.formats)
    uniforms = sum(1 for c in choices if c != FP16)
    plans = len(grid.budgets) * grid.replicates * (4 * len(grid.profile_texts) + 1)
    profiles = 2 * grid.replicates * len(grid.profile_texts)
    return profiles * _profile_steps(choices, n_layers) + (uniforms + plans) * len(grid.heldout_texts)


def _profile_steps(choices, n_layers: int) -> int:
    from wkvlab.search.profile import profile_steps
    from wkvlab.weights.spec import WeightSpec

    return profile_steps(n_layers, choices, WeightSpec(), weight_profile=False)


@dataclass(frozen=True)
class HeldOutScore:
    """A plan's KLD on the held-out windows, kept per window: the sum and count of its per-token KLD in each.

    That is all the finding reads (the token mean, the per-document means its intervals resample), and it is a few
    hundred bytes where the per-token arrays were 64 KB a score: the ~900 scores of a SmolLM2 run fit in a folder a
    run measured over several sessions carries from one machine to the next (scripts/carry.py)."""

    sums: np.ndarray  # float64, one per window
    counts: np.ndarray  # int64, scored tokens per window

    @property
    def kld(self) -> float:
        return float(self.sums.sum() / self.counts.sum())

    @property
    def tokens(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_score(cls, score, n_windows: int) -> "HeldOutScore":
        windows = np.asarray(score.windows, dtype=np.int64)
        return cls(np.bincount(windows, weights=score.per_token, minlength=n_windows),
                   np.bincount(windows, minlength=n_windows).astype(np.int64))


SCORE_VERSION = 2  # 1 kept per-token arrays; 2 per-window sums (HeldOutScore)


def _cached_score(path_key: dict, score_fn, n_windows: int) -> HeldOutScore:
    """A plan's held-out score from the on-disk cache, or computed now and saved."""
    from wkvlab.models.loading import cache_dir

    key = hashlib.sha256(json.dumps({"version": SCORE_VERSION, **path_key}, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir() / "findings-search" / f"{key}.npz"
    if path.is_file():
        data = np.load(path)
        return HeldOutScore(data["sums"], data["counts"])
    score = HeldOutScore.from_score(score_fn(), n_windows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, sums=score.sums, counts=score.counts)
    tmp.replace(path)  # a killed run never leaves half a file under the real name
    return score


def rank_correlations(plans: dict, predict, measured: dict, plan_bytes) -> tuple[float, float, int]:
    """(Spearman of predicted vs measured KLD, Spearman of −bytes vs measured KLD, distinct plans) over ``plans``
    (name → per-layer plan), each distinct plan once (the first name that has it): two names for one plan are one point."""
    from wkvlab.search.predict import spearman

    first = {}
    for name, plan in plans.items():
        first.setdefault(plan, name)
    names = list(first.values())
    kld = [measured[k] for k in names]
    return (spearman([predict(plans[k]) for k in names], kld), spearman([-plan_bytes(plans[k]) for k in names], kld), len(names))


def measure_search(model: str, grid: SearchGrid, *, progress=None, device: str = "auto", dtype: str = "auto",
                   margin: float = 0.10) -> SearchFinding:
    """Replicated profiles on each profile text (with and without the weights), plans at each budget, held-out scores.

    ``progress(total, title)``: a context yielding ``tick(description, steps)`` (the findings' bars)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        def open_bar(n_layers: int) -> Tick:
            if progress is None:
                return lambda _d, _n: None
            title = f"search: {len(grid.budgets)} budgets x {len(grid.profile_texts)} profile texts x {grid.replicates} replicates"
            return stack.enter_context(progress(search_steps(grid, n_layers), title))

        return _measure(model, grid, open_bar, device=device, dtype=dtype, margin=margin)


def _windows(grid: SearchGrid, texts, tok, bos):
    """Per text: the held-out windows, spread one per document over the first documents that hold one (the units
    intervals resample), then ``replicates`` disjoint profile window sets cut from the documents no held-out window
    touches — so no profile sees a held-out document — and how many tokens of the text they reach."""
    from wkvlab.data import load_corpus, make_windows, tokenize
    from wkvlab.data.windows import make_document_windows
    from wkvlab.errors import DataError
    from wkvlab.stats.bootstrap import MIN_UNITS

    body = grid.ctx - (1 if bos is not None else 0)
    per_profile = max(1, grid.profile_tokens // grid.ctx)
    corpora, profile_windows, heldout_windows, used = {}, {}, {}, {}
    for text in texts:
        corpus = load_corpus(text)
        if not corpus.documents:
            raise DataError(f"{corpus.name} is one stream; the search finding's held-out windows are spread over documents "
                            "(an embedded text, or a .jsonl file of records)")
        docs = [tokenize(tok, d) for d in corpus.documents]
        held = make_document_windows(docs, ctx=grid.ctx, n_tokens=grid.heldout_tokens, bos_id=bos)
        distinct = len(set(held.documents))
        if distinct < MIN_UNITS:
            raise DataError(f"the held-out windows of {corpus.name} cover {distinct} documents, fewer than the {MIN_UNITS} an interval "
                            "needs; use a smaller --ctx")
        touched = set(held.documents)
        needed = grid.replicates * per_profile * body
        stream, last = [], max(touched)
        for d, ids in enumerate(docs):
            if d not in touched and sum(x.numel() for x in stream) < needed:
                stream.append(ids)
                last = max(last, d)
        import torch

        ids = torch.cat(stream) if stream else torch.zeros(0, dtype=torch.long)
        if ids.numel() < needed:
            raise DataError(f"{corpus.name} has {ids.numel():,} tokens outside the held-out documents, too few for {grid.replicates} "
                            f"profiles of the search finding ({needed:,}); lower --tokens")
        start, sets = 0, []
        for _ in range(grid.replicates):
            sets.append(make_windows(ids[start:], ctx=grid.ctx, n_tokens=grid.profile_tokens, bos_id=bos))
            start += sets[-1].n_windows * body
        corpora[text], profile_windows[text], heldout_windows[text] = corpus, sets, held
        end = sum(len(t) for t in corpus.documents[: last + 1]) + 2 * last  # joined by blank lines
        used[text] = tokenize(tok, corpus.text[:end]).numel()  # calibration comes from after every window
    return corpora, profile_windows, heldout_windows, used


def document_means(score: HeldOutScore, documents) -> np.ndarray:
    """Mean KLD of each held-out document (sorted document order; ``documents[w]`` owns window ``w``): the unit
    intervals resample (issue #38: windows of one document share its difficulty, and resampling them as independent
    under-covers)."""
    _, inverse = np.unique(np.asarray(documents), return_inverse=True)
    return np.bincount(inverse, weights=score.sums) / np.bincount(inverse, weights=score.counts)


def _measure(model: str, grid: SearchGrid, open_bar: Callable[[int], Tick], *, device: str, dtype: str,
             margin: float = 0.10) -> SearchFinding:
    import torch

    from wkvlab.data import tokenizer_wants_bos
    from wkvlab.errors import DataError
    from wkvlab.models.loading import load_model, resolve_device, resolve_dtype
    from wkvlab.search.allocate import allocate_exact
    from wkvlab.search.api import SEARCH_WORDS, cached_profile, numerics
    from wkvlab.search.baselines import (budget_step, check_reachable, fill_to_budget, greedy_mix, random_mixes,
                                         uniform_at_budget, uniform_plan)
    from wkvlab.search.choices import FP16, choice_bytes, choice_label, parse_choices
    from wkvlab.search.export import plan_kvspec
    from wkvlab.search.kvtuner import kvtuner_rule
    from wkvlab.search.measure import Scorer
    from wkvlab.search.pareto import Point, pareto_front
    from wkvlab.search.predict import predictor_from_profile, spearman
    from wkvlab.stats.decision import MarginRule, decide
    from wkvlab.stats.twostage import MIN_PROFILES, two_stage
    from wkvlab.weights.apply import quantize_model_weights
    from wkvlab.weights.calibration import CalibrationSpec, calibration_corpus, calibration_set
    from wkvlab.weights.spec import WeightSpec

    if grid.replicates < MIN_PROFILES:
        raise DataError(f"the search finding needs ≥ {MIN_PROFILES} replicated profiles per text for its two-stage interval, got {grid.replicates}")
    resolved = resolve_device(device)
    loaded = load_model(model, device=resolved, dtype=resolve_dtype(dtype, resolved))
    tok = loaded.tokenizer
    bos = tok.bos_token_id if tokenizer_wants_bos(tok) else None
    texts = list(dict.fromkeys((*grid.profile_texts, *grid.heldout_texts)))
    corpora, profile_windows, heldout_windows, used = _windows(grid, texts, tok, bos)

    weights, choices = WeightSpec.parse(grid.weights), parse_choices(grid.formats)
    calibration = None
    if weights.needs_calibration:  # prose calibration from the end of the prose text, past every window
        cspec = CalibrationSpec()
        ccorpus = calibration_corpus(cspec.data)
        reserved = max((used[t] for t in texts if corpora[t].sha256 == ccorpus.sha256), default=0)
        calibration = calibration_set(cspec, tok, corpus=ccorpus, reserved_tokens=reserved)
    reference = loaded.model
    qw = quantize_model_weights(reference, weights, calibration, model_key=loaded.fingerprint)

    config = reference.config.get_text_config() if hasattr(reference.config, "get_text_config") else reference.config
    n = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_choice = {c: choice_bytes(c, kv_heads=heads, head_dim=head_dim) for c in choices}
    costs = [[per_choice[c] for c in choices] for _ in range(n)]
    fp16_bytes, step = per_choice[FP16] * n, budget_step(costs)
    plan_bytes = lambda plan: float(sum(per_choice[c] for c in plan))  # noqa: E731
    for share in grid.budgets:
        try:
            check_reachable(costs, share * fp16_bytes)
        except ValueError as exc:
            raise DataError(f"search finding: {share:.0%} of the 16-bit cache: {exc}") from None
    tick = open_bar(n)

    def bars(_title, _total):
        from contextlib import nullcontext
        return nullcontext(tick)

    predictors, plans, seconds = {}, {}, {}
    as_plan = lambda options: tuple(choices[o] for o in options)  # noqa: E731
    quantized = tuple(i for i, c in enumerate(choices) if c != FP16)  # KVTuner's pair list has no 16-bit pair
    for text in grid.profile_texts:
        fingerprints = {"model_sha256": loaded.fingerprint, "data_sha256": corpora[text].sha256, **numerics(loaded)}
        common = dict(model_name=loaded.name, data_name=corpora[text].name, fingerprints=fingerprints, bars=bars)
        for r, windows in enumerate(profile_windows[text]):
            for aware, spec in (("aware", weights), ("unaware", WeightSpec())):
                prof, cached = cached_profile(reference, windows, spec, choices, weight_profile=False,
                                              calibration=calibration if aware == "aware" else None, **common)
                if cached:  # a resumed run's bar (and its ETA) starts where the cache leaves off
                    tick(f"profile {text} replicate {r} {aware} (cached)", _profile_steps(choices, n))
                seconds[f"{text}/{r}/{aware}"] = prof.seconds
                predictors[(text, r, aware)] = predictor_from_profile(prof)
            for share in grid.budgets:
                budget = share * fp16_bytes
                values = {a: [[p.alpha_kv * p.layer_kv(l, c) for c in choices] for l in range(n)]
                          for a, p in ((a, predictors[(text, r, a)]) for a in ("aware", "unaware"))}
                for aware in ("aware", "unaware"):
                    alloc = allocate_exact(values[aware], costs, budget)
                    plans[(text, r, aware, share)] = as_plan(fill_to_budget(alloc.options, costs, budget, values[aware]))
                plans[(text, r, "greedy", share)] = as_plan(greedy_mix(values["aware"], costs, budget))
                rule = kvtuner_rule(values["unaware"], costs, budget, quantized)  # check_reachable above: something fits
                plans[(text, r, "kvtuner", share)] = as_plan(rule.options)
    for share in grid.budgets:
        for r, options in enumerate(random_mixes(costs, share * fp16_bytes, grid.replicates, seed=round(share * 1000))):
            plans[("", r, "random", share)] = as_plan(options)

    uniforms = {choice_label(c): uniform_plan(c, n) for c in choices if c != FP16}
    name_of = lambda t, r, k, s: f"{t + '/' if t else ''}{r}/{k}/{s:.2f}"  # noqa: E731
    configs = {**{f"uniform {k}": v for k, v in uniforms.items()}, **{name_of(*key): plan for key, plan in plans.items()}}
    scores = {}
    for text in grid.heldout_texts:
        windows = heldout_windows[text]
        scorer = Scorer(reference, windows)
        digest = hashlib.sha256(windows.tokens.numpy().tobytes()).hexdigest()
        seen = {}
        for name, plan in configs.items():
            if plan in seen:  # the same per-layer plan twice (a DP and a greedy plan that agree): one score
                scores[(text, name)] = scores[(text, seen[plan])]
                tick(f"held-out {text}: {name} (the plan of {seen[plan]})", 1)
                continue
            spec = plan_kvspec(plan)
            key = {"model": loaded.fingerprint, **numerics(loaded), "weights": {**weights.to_dict(), "label": None},
                   "calibration": calibration.key if calibration is not None else None, "kv": spec.to_dict(), "windows": digest}
            with torch.no_grad():
                scores[(text, name)] = _cached_score(key, lambda: scorer.score(qw.model, spec), windows.n_windows)
            seen[plan] = name
            tick(f"held-out {text}: {name}", 1)

    R = grid.replicates
    rows, effects = [], []
    for text in grid.profile_texts:
        for share in grid.budgets:
            budget = share * fp16_bytes
            uni = uniform_at_budget(tuple(c for c in choices if c != FP16), n, budget, plan_bytes, grid.uniform_tolerance)
            uni_name = choice_label(uni) if uni is not None else ""
            names = {k: [name_of(text, r, k, share) for r in range(R)] for k in ("aware", "unaware", "greedy", "kvtuner")}
            names["random"] = [name_of("", r, "random", share) for r in range(R)]
            spent = {k: (min(plan_bytes(configs[x]) for x in v), max(plan_bytes(configs[x]) for x in v)) for k, v in names.items()}
            if uni is not None:
                names["uniform"] = [f"uniform {uni_name}"] * R
                spent["uniform"] = (plan_bytes(uniforms[uni_name]),) * 2
            same = {k: all(configs[a] == configs[b] for a, b in zip(names["aware"], v)) for k, v in names.items() if k != "aware"}
            for held in grid.heldout_texts:
                owners = heldout_windows[held].documents
                per = {k: np.stack([document_means(scores[(held, x)], owners) for x in v]) for k, v in names.items()}
                kld = {k: float(np.mean([scores[(held, x)].kld for x in v])) for k, v in names.items()}
                tokens = scores[(held, names["aware"][0])].tokens
                diffs, mine = {}, {}
                for rival in RIVALS:
                    if rival not in per:
                        continue
                    draws = replace(two_stage(per["aware"] - per[rival]), unit="documents")
                    diffs[rival] = draws.interval()
                    if same[rival]:  # the same plans in every replicate: a difference of exactly 0 is no evidence of anything
                        continue
                    label = (f"uniform {uni_name}" if rival == "uniform" else "random mixes" if rival == "random"
                             else "KVTuner's rule (approx.)" if rival == "kvtuner" else f"the {rival} plans")
                    mine[rival] = len(effects)
                    # m is a share of the rival's KLD estimated on the same documents and profiles: its draws
                    # go into the test with the difference's (stats.decision.sides)
                    own = replace(two_stage(per[rival]), unit="documents")
                    effects.append(MarginRule.parse(margin).difference_effect(f"{text}/{share:.0%}/{held}: aware − {label}", draws, own,
                                                                              f"KLD of {label}", tokens, unit="nats", words=SEARCH_WORDS))
                rows.append((PlanRow(text, budget, share, held, kld["aware"], kld["unaware"], uni_name, kld.get("uniform", float("nan")),
                                     tokens, R, kld["greedy"], kld["random"], step, kld["kvtuner"], spent, diffs,
                                     identical=tuple(k for k in RIVALS if same.get(k) and k in per),
                                     per_document={k: [[float(f"{x:.6g}") for x in row] for row in v] for k, v in per.items()}), mine))
    verdicts = decide(effects, family="search finding: every aware − rival difference at equal memory")
    rows = [replace(row, verdicts={k: verdicts[i] for k, i in mine.items()}) for row, mine in rows]

    rho, curve, by_bytes, distinct = {}, {}, {}, {}
    for text in grid.profile_texts:
        p = predictors[(text, 0, "aware")]
        for held in grid.heldout_texts:
            mine = [k for k in configs if not k.split("/")[0] in grid.profile_texts or k.startswith(f"{text}/")]
            key = f"{text} -> {held}"
            rho[key], by_bytes[key], distinct[key] = rank_correlations({k: configs[k] for k in mine}, p.predict,
                                                                      {k: scores[(held, k)].kld for k in mine}, plan_bytes)
            points = [(f"uniform {k}", "uniform", plan_bytes(v) / fp16_bytes, plan_bytes(v), scores[(held, f"uniform {k}")].kld)
                      for k, v in uniforms.items()]
            for share in grid.budgets:
                for kind in ("aware", "unaware", "kvtuner", "greedy", "random"):
                    keys = [name_of("" if kind == "random" else text, r, kind, share) for r in range(R)]
                    points.append((f"{kind} at {share:.0%}", kind, share, float(np.mean([plan_bytes(configs[k]) for k in keys])),
                                   float(np.mean([scores[(held, k)].kld for k in keys]))))
            front = {q.name for q in pareto_front([Point(name, b, v) for name, _, _, b, v in points])}
            curve[f"{text} -> {held}"] = [{"name": name, "kind": kind, "share": s, "bytes": b, "kld": v, "front": name in front}
                                          for name, kind, s, b, v in sorted(points, key=lambda x: (x[3], x[4]))]
    agreement, between = {}, ""
    pair = ([(grid.profile_texts[0], 0), (grid.profile_texts[1], 0)] if len(grid.profile_texts) >= 2
            else [(grid.profile_texts[0], 0), (grid.profile_texts[0], 1)])
    first, second = (predictors[(t, r, "aware")] for t, r in pair)
    between = " and ".join(f"{t} (replicate {r})" for t, r in pair)
    for side, deltas in (("K", "k_delta"), ("V", "v_delta")):
        for fmt in getattr(first, deltas):
            agreement[f"{side} {fmt}"] = spearman(list(getattr(first, deltas)[fmt]), list(getattr(second, deltas)[fmt]))
    labels = {name_of(*key): [choice_label(c) for c in plan] for key, plan in plans.items()}
    return SearchFinding(rows, rho, agreement, labels, seconds, curve, between, by_bytes, distinct)


def search_rows_from_dict(data: dict) -> list[PlanRow]:
    """Rows back from :meth:`SearchFinding.to_dict` (version 2; :func:`is_unequal_memory` tells the old ones)."""
    from wkvlab.stats.decision import Verdict

    plain = ("profile_text", "budget", "share", "heldout_text", "aware", "unaware", "uniform_name", "uniform", "tokens",
             "replicates", "greedy", "random", "step", "kvtuner")
    return [PlanRow(**{k: (float("nan") if r[k] is None else r[k]) for k in plain if k in r},
                    bytes={k: tuple(v) for k, v in (r.get("bytes") or {}).items()},
                    differences={k: Interval.from_dict(v) for k, v in (r.get("differences") or {}).items()},
                    verdicts={k: Verdict.from_dict(v) for k, v in (r.get("verdicts") or {}).items()},
                    identical=tuple(r.get("identical") or ()), per_document=r.get("per_document") or {})
            for r in data["rows"]]


def is_unequal_memory(data: dict) -> bool:
    """A finding stored before version 2: one profile per text, a 'best fitting uniform' at or under the budget."""
    return data.get("version", 1) < 2


__all__ = ["SearchGrid", "SearchFinding", "PlanRow", "measure_search", "search_steps", "search_rows_from_dict", "is_unequal_memory"]
