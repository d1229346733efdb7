"""The search finding: does a weight-aware per-layer KV plan beat a weight-unaware one?

The search (:mod:`wkvlab.search`) allocates per-layer K/V formats under a byte budget from a
sensitivity profile. Weight-aware: the profile is measured with the quantized weights in place;
weight-unaware (KVTuner-style): with 16-bit weights, then shipped under the quantized weights.
This finding asks the question so that the answer does not hang on one text or one budget:

* each profile is measured on two texts (prose and code, ``profile_texts``), so the predictor's
  held-out rank correlation can be compared across profile texts;
* plans are allocated for several budgets, given as shares of the 16-bit cache's bytes per token;
* every plan, and every uniform pair, is scored on held-out windows of *both* texts — the same
  windows for every plan, never overlapping a profile window — so each comparison is paired.

The expensive part, the profiles, is cached on disk by content (:func:`wkvlab.search.api.cached_profile`);
held-out scores are cached the same way (per-token KLD, keyed by model, weights, KV plan and
windows), so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from wkvlab.stats import Interval

Tick = Callable[[str, float], None]

VERSION = 1


@dataclass(frozen=True)
class SearchGrid:
    """What the finding measures on one model (``sizes`` in :mod:`wkvlab.findings.grids`)."""

    weights: str = "int4-g128"
    formats: str = "K8V8,K8V4,K4V4,K4V2"
    profile_texts: tuple = ("default", "code")
    heldout_texts: tuple = ("default", "code")
    budgets: tuple = (0.33, 0.40, 0.47)  # shares of the 16-bit cache's bytes per token
    ctx: int = 256
    profile_tokens: int = 1024
    heldout_tokens: int = 4096


@dataclass(frozen=True)
class PlanRow:
    """One (profile text, budget, held-out text): the aware plan against the unaware plan and the best uniform pair."""

    profile_text: str
    budget: float  # bytes per token
    share: float  # of the 16-bit cache
    heldout_text: str
    aware: float
    unaware: float
    uniform_name: str
    uniform: float
    aware_minus_unaware: Interval
    aware_minus_uniform: Interval | None  # None when no uniform pair fits the budget
    tokens: int
    verdicts: dict = field(default_factory=dict)  # "unaware" / "uniform" -> Verdict (the one rule, Holm over the finding)

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in ("profile_text", "budget", "share", "heldout_text", "aware", "unaware", "uniform_name",
                                                 "uniform", "tokens")},
                "aware_minus_unaware": self.aware_minus_unaware.to_dict() if self.aware_minus_unaware else None,
                "aware_minus_uniform": self.aware_minus_uniform.to_dict() if self.aware_minus_uniform else None,
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()}}


@dataclass
class SearchFinding:
    rows: list[PlanRow]
    rank_correlation: dict  # "profile text -> held-out text" -> Spearman of predicted vs held-out KLD
    layer_agreement: dict  # format -> Spearman of the two profile texts' per-layer deltas (weight-aware)
    plans: dict  # "profile text / aware|unaware / share" -> per-layer choice labels
    profile_seconds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"rows": [r.to_dict() for r in self.rows], "rank_correlation": self.rank_correlation,
                "layer_agreement": self.layer_agreement, "plans": self.plans, "profile_seconds": self.profile_seconds}


def search_steps(grid: SearchGrid, n_layers: int) -> int:
    """Progress steps: four profiles' passes (upper bound) and the held-out scores."""
    from wkvlab.search.choices import parse_choices
    from wkvlab.search.choices import single_formats

    choices = parse_choices(grid.formats)
    ks, vs = single_formats(choices)
    per_profile = 3 + n_layers * (len(ks) + len(vs)) + len(choices)
    configs = len(choices) + 2 * len(grid.budgets) * len(grid.profile_texts)
    return 2 * len(grid.profile_texts) * per_profile + configs * len(grid.heldout_texts)


def _cached_score(path_key: dict, score_fn):
    """Per-token KLD and window ids from the on-disk cache, or computed now and saved."""
    from wkvlab.models.loading import cache_dir
    from wkvlab.search.measure import Score

    key = hashlib.sha256(json.dumps({"version": VERSION, **path_key}, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir() / "findings-search" / f"{key}.npz"
    if path.is_file():
        data = np.load(path)
        kld, windows = data["kld"], data["windows"]
        se = float(kld.std(ddof=1) / np.sqrt(kld.size)) if kld.size > 1 else float("nan")
        return Score(float(kld.mean()), se, int(kld.size), kld, windows)
    score = score_fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, kld=score.per_token, windows=score.windows)
    tmp.replace(path)  # a killed run never leaves half a file under the real name
    return score


def measure_search(model: str, grid: SearchGrid, *, progress=None, device: str = "auto", dtype: str = "auto",
                   margin: float = 0.10) -> SearchFinding:
    """Profiles on each profile text (with and without the weights), plans per budget, held-out scores on every text.

    ``progress(total, title)``: a context yielding ``tick(description, steps)`` (the findings' bars)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        def open_bar(n_layers: int) -> Tick:
            if progress is None:
                return lambda _d, _n: None
            title = f"search: {len(grid.budgets)} budgets x {len(grid.profile_texts)} profile texts"
            return stack.enter_context(progress(search_steps(grid, n_layers), title))

        return _measure(model, grid, open_bar, device=device, dtype=dtype, margin=margin)


def _measure(model: str, grid: SearchGrid, open_bar: Callable[[int], Tick], *, device: str, dtype: str,
             margin: float = 0.10) -> SearchFinding:
    import torch

    from wkvlab.data import load_corpus, make_windows, tokenize, tokenizer_wants_bos
    from wkvlab.errors import DataError
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import load_model
    from wkvlab.search.allocate import allocate_exact
    from wkvlab.search.api import cached_profile, numerics
    from wkvlab.search.baselines import uniform_plan
    from wkvlab.search.choices import FP16, choice_bytes, choice_label, parse_choices
    from wkvlab.search.export import plan_kvspec
    from wkvlab.search.api import SEARCH_WORDS
    from wkvlab.search.measure import Scorer, paired_draws
    from wkvlab.stats.decision import Effect, Margin, decide
    from wkvlab.search.predict import predictor_from_profile, spearman
    from wkvlab.weights.apply import quantize_model_weights
    from wkvlab.weights.calibration import CalibrationSpec, calibration_corpus, calibration_set
    from wkvlab.weights.spec import WeightSpec

    from wkvlab.models.loading import resolve_device, resolve_dtype

    resolved = resolve_device(device)
    loaded = load_model(model, device=resolved, dtype=resolve_dtype(dtype, resolved))
    tok = loaded.tokenizer
    bos = tok.bos_token_id if tokenizer_wants_bos(tok) else None
    body = grid.ctx - (1 if bos is not None else 0)
    texts = list(dict.fromkeys((*grid.profile_texts, *grid.heldout_texts)))
    corpora, profile_windows, heldout_windows, used = {}, {}, {}, {}
    for text in texts:
        corpus = load_corpus(text)
        ids = tokenize(tok, corpus.text)
        prof = make_windows(ids, ctx=grid.ctx, n_tokens=grid.profile_tokens, bos_id=bos)
        start = prof.n_windows * body
        if ids.numel() < start + (grid.heldout_tokens // grid.ctx) * body:
            raise DataError(f"{corpus.name} has {ids.numel()} tokens, too few for the search finding's windows; lower --tokens")
        corpora[text], profile_windows[text] = corpus, prof
        heldout_windows[text] = make_windows(ids[start:], ctx=grid.ctx, n_tokens=grid.heldout_tokens, bos_id=bos)
        used[text] = start + heldout_windows[text].n_windows * body

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
    fp16_bytes = per_choice[FP16] * n
    tick = open_bar(n)

    def bars(_title, _total):
        from contextlib import nullcontext
        return nullcontext(tick)

    predictors, plans, seconds, profiles = {}, {}, {}, {}
    for text in grid.profile_texts:
        fingerprints = {"model_sha256": loaded.fingerprint, "data_sha256": corpora[text].sha256, **numerics(loaded)}
        common = dict(model_name=loaded.name, data_name=corpora[text].name, fingerprints=fingerprints, bars=bars)
        for aware, spec in (("aware", weights), ("unaware", WeightSpec())):
            prof, _ = cached_profile(reference, profile_windows[text], spec, choices, weight_profile=False,
                                     calibration=calibration if aware == "aware" else None, **common)
            profiles[(text, aware)] = prof
            seconds[f"{text}/{aware}"] = prof.seconds
            predictors[(text, aware)] = predictor_from_profile(prof)
        for share in grid.budgets:
            for aware in ("aware", "unaware"):
                p = predictors[(text, aware)]
                alloc = allocate_exact([[p.alpha_kv * p.layer_kv(l, c) for c in choices] for l in range(n)],
                                       [[per_choice[c] for c in choices] for _ in range(n)], share * fp16_bytes)
                if alloc is None:
                    raise DataError(f"no plan fits {share:.0%} of the 16-bit cache with formats {grid.formats}; raise the budgets")
                plans[(text, aware, share)] = tuple(choices[o] for o in alloc.options)

    uniforms = {choice_label(c): uniform_plan(c, n) for c in choices if c != FP16}
    configs = {**{f"uniform {k}": v for k, v in uniforms.items()},
               **{f"{t}/{a}/{s:.2f}": plan for (t, a, s), plan in plans.items()}}
    scores = {}
    for text in grid.heldout_texts:
        windows = heldout_windows[text]
        scorer = Scorer(reference, windows)
        digest = hashlib.sha256(windows.tokens.numpy().tobytes()).hexdigest()
        for name, plan in configs.items():
            spec = plan_kvspec(plan)
            key = {"model": loaded.fingerprint, **numerics(loaded), "weights": {**weights.to_dict(), "label": None},
                   "calibration": calibration.key if calibration is not None else None, "kv": spec.to_dict(), "windows": digest}
            with torch.no_grad():
                scores[(text, name)] = _cached_score(key, lambda: scorer.score(qw.model, spec))
            tick(f"held-out {text}: {name}", 1)

    plan_bytes = lambda plan: sum(per_choice[c] for c in plan)  # noqa: E731
    rows, effects = [], []
    for text in grid.profile_texts:
        for share in grid.budgets:
            budget = share * fp16_bytes
            fitting = [k for k, v in uniforms.items() if plan_bytes(v) <= budget]
            for held in grid.heldout_texts:
                a, u = scores[(held, f"{text}/aware/{share:.2f}")], scores[(held, f"{text}/unaware/{share:.2f}")]
                best = min(fitting, key=lambda k: scores[(held, f"uniform {k}")].kld) if fitting else None
                b = scores[(held, f"uniform {best}")] if best else None
                versus_u, versus_b = paired_draws(a, u), paired_draws(a, b) if b else None
                mine = {}
                for key, draws, rival, name in (("unaware", versus_u, u, "the unaware plan"), ("uniform", versus_b, b, f"uniform {best}")):
                    if draws is not None:
                        mine[key] = len(effects)
                        effects.append(Effect(f"{text}/{share:.0%}/{held}: aware − {name}", draws,
                                              Margin.relative_to(rival.kld, f"KLD of {name}", margin), a.tokens, SEARCH_WORDS))
                rows.append((PlanRow(text, budget, share, held, a.kld, u.kld, best or "none fits", b.kld if b else float("nan"),
                                     versus_u.interval() if versus_u else None, versus_b.interval() if versus_b else None, a.tokens), mine))
    verdicts = decide(effects, family="search finding: every aware − unaware and aware − uniform difference")
    rows = [replace(row, verdicts={k: verdicts[i] for k, i in mine.items()}) for row, mine in rows]
    rho = {}
    for text in grid.profile_texts:
        p = predictors[(text, "aware")]
        for held in grid.heldout_texts:
            names = list(configs)
            rho[f"{text} -> {held}"] = spearman([p.predict(configs[k]) for k in names], [scores[(held, k)].kld for k in names])
    agreement = {}
    if len(grid.profile_texts) >= 2:
        first, second = (predictors[(t, "aware")] for t in grid.profile_texts[:2])
        for side, deltas in (("K", "k_delta"), ("V", "v_delta")):
            for fmt in getattr(first, deltas):
                agreement[f"{side} {fmt}"] = spearman(list(getattr(first, deltas)[fmt]), list(getattr(second, deltas)[fmt]))
    labels = {f"{t}/{a}/{s:.2f}": [choice_label(c) for c in plan] for (t, a, s), plan in plans.items()}
    return SearchFinding(rows, rho, agreement, labels, seconds)


def search_rows_from_dict(data: dict) -> list[PlanRow]:
    """Rows back from :meth:`SearchFinding.to_dict` (for rendering stored findings)."""
    from wkvlab.stats.decision import Verdict

    return [PlanRow(**{k: v for k, v in r.items() if k not in ("aware_minus_unaware", "aware_minus_uniform", "verdicts")},
                    aware_minus_unaware=Interval.from_dict(r["aware_minus_unaware"]) if r["aware_minus_unaware"] else None,
                    aware_minus_uniform=Interval.from_dict(r["aware_minus_uniform"]) if r["aware_minus_uniform"] else None,
                    verdicts={k: Verdict.from_dict(v) for k, v in (r.get("verdicts") or {}).items()})
            for r in data["rows"]]


__all__ = ["SearchGrid", "SearchFinding", "PlanRow", "measure_search", "search_steps"]
