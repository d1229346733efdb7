"""Tables of the findings, from stored per-token arrays, every number with a paired interval.

All intervals come from :func:`wkvlab.stats.resample` (skew-robust t over units, analytic,
the same windows for every config compared), and every verdict from the one decision rule
(:func:`wkvlab.stats.decide`), as in explain, compare and the report: a table's tests are one
family, Holm-adjusted together, and each row shows its raw and its adjusted interval, its margin
m (10% of the cache's own KLD by default) and its verdict — *compounds*, *sub-additive*,
*additive within ±m* or *undecided* with the tokens that would decide it.

**Replicates** (``replicates``): the grid measured again (``wkvlab findings --replicates``: another
calibration sample for calibrated configs, another chunk size for every pass, :mod:`wkvlab.sweep.plan`),
on the same windows. Every statistic is computed in each replicate and pooled by
:func:`wkvlab.stats.pool`, as ``wkvlab explain`` pools its factorial: between-window plus
between-replicate variance, Welch–Satterthwaite df (:mod:`wkvlab.stats.replicates`), so a claim about
a method or a config includes run-to-run variance; each interval records how many replicates it holds.

The practitioner's number leads: the interaction against the cache's own cost (``share_of_cache``
= interaction / KLD(C), how much more the cache costs under these weights than alone), not only
against the sum of both costs (``share``), which a large weight error makes small.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from wkvlab.errors import DataError
from wkvlab.eval.result import EvalResult
from wkvlab.explain.compare import check_replicates
from wkvlab.explain.factorial import interaction_effect, pooled_effect_draws
from wkvlab.kv.spec import KVSpec
from wkvlab.stats import Interval, Resampled, pool, resample
from wkvlab.stats.decision import DEFAULT_MARGIN, MarginRule, Verdict, decide
from wkvlab.weights.spec import WeightSpec


def _is_none(result: EvalResult) -> bool:
    return WeightSpec.from_dict(result.weights_spec).is_identity


def _is_fp16(result: EvalResult) -> bool:
    return KVSpec.from_dict(result.kv_spec).is_identity


@dataclass(frozen=True)
class AdditivityRow:
    weights: str
    kv: str
    w: Interval  # KLD of the weights with a 16-bit cache
    c: Interval  # KLD of the cache with unquantized weights
    wc: Interval  # KLD of both
    interaction: Interval  # wc − w − c (raw 95%)
    tokens: int
    verdict: Verdict  # the one rule, Holm-adjusted over the grid's rows

    @property
    def share(self) -> float:
        """The interaction as a share of the sum of the main effects."""
        total = self.w.estimate + self.c.estimate
        return self.interaction.estimate / total if total else float("nan")

    @property
    def share_of_cache(self) -> float:
        """The interaction as a share of the cache's own cost: how much more the cache costs under W."""
        return self.interaction.estimate / self.c.estimate if self.c.estimate else float("nan")

    @property
    def tokens_needed(self) -> int | None:
        return self.verdict.tokens_needed

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, **{k: getattr(self, k).to_dict() for k in ("w", "c", "wc", "interaction")},
                "tokens": self.tokens, "share": self.share, "share_of_cache": self.share_of_cache,
                "verdict": self.verdict.word, "decision": self.verdict.to_dict(), "tokens_needed": self.tokens_needed}


def _reference_cell(results: list[EvalResult]) -> EvalResult:
    """The grid's unquantized weights × 16-bit cache: the factorial's reference cell."""
    ref = next((r for r in results if _is_none(r) and _is_fp16(r)), None)
    if ref is None:
        raise DataError("the grid has no unquantized weights × fp16 cell; add weights 'none' and kv 'fp16' to it")
    return ref


Runs = list  # one grid's results in each replicate, the measurement itself first: [{(weights, kv): EvalResult}, ...]


def _runs(results: list[EvalResult], replicates: Iterable[Iterable[EvalResult]]) -> Runs:
    return [{(r.weights, r.kv): r for r in run} for run in [results, *replicates]]


def _in_runs(runs: Runs, cells: Mapping[str, EvalResult]) -> list[dict[str, EvalResult]]:
    """``cells`` (named results of the first run) in every replicate, each run's on the same tokens, all on the same windows."""
    found = []
    for i, run in enumerate(runs):
        missing = [c for c in cells.values() if (c.weights, c.kv) not in run]
        if missing:
            raise DataError(f"replicate {i} has no {missing[0].weights} × {missing[0].kv} cell; run the finding again with the "
                            f"same --replicates (it resumes) or with --replicates {i}")
        found.append({name: run[(c.weights, c.kv)] for name, c in cells.items()})
    check_replicates(found)
    return found


def _pooled(statistic: Callable, runs: Sequence[Mapping[str, EvalResult]]) -> Resampled:
    """``statistic`` of the cells' token-weighted mean KLDs, paired over windows in each replicate, pooled over them."""
    return pool([resample(statistic, {k: r.arrays.kld for k, r in cells.items()}, next(iter(cells.values())).arrays.units)
                 for cells in runs])


def additivity(results: Iterable[EvalResult], *, margin: float = DEFAULT_MARGIN,
               replicates: Sequence[Iterable[EvalResult]] = ()) -> list[AdditivityRow]:
    """The 2×2 factorial of every (W, C) pair of a weights × KV grid that holds none and fp16.

    ``replicates``: the grid measured again on the same windows, pooled into every interval (module docstring).
    The grid's interactions are one family: their verdicts are Holm-adjusted together."""
    results = list(results)
    runs = _runs(results, replicates)
    ref = _reference_cell(results)
    by_w = {r.weights: r for r in results if _is_fp16(r) and not _is_none(r)}
    by_c = {r.kv: r for r in results if _is_none(r) and not _is_fp16(r)}
    found = []
    for r in results:
        if _is_none(r) or _is_fp16(r) or r.weights not in by_w or r.kv not in by_c:
            continue
        cells = _in_runs(runs, {"ref": ref, "w": by_w[r.weights], "c": by_c[r.kv], "wc": r})
        found.append((r, pooled_effect_draws(cells, "kld")))
    tests = [interaction_effect(d, "kld", r.tokens, margin, name=f"{r.weights} × {r.kv}") for r, d in found]
    verdicts = decide(tests, family=f"{ref.model} additivity grid")
    return [AdditivityRow(r.weights, r.kv, d["w"].interval(), d["c"].interval(), d["wc"].interval(), d["interaction"].interval(), r.tokens, v)
            for (r, d), v in zip(found, verdicts)]


@dataclass(frozen=True)
class PenaltyRow:
    """What a cache adds under one weight config: KLD(W × C) − KLD(W × fp16), and against unquantized weights."""

    weights: str
    kv: str
    penalty: Interval
    vs_unquantized: Interval | None  # penalty under W minus penalty under unquantized weights: the additivity interaction
    verdict: Verdict | None = None  # the one rule on vs_unquantized, Holm-adjusted over the table

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "penalty": self.penalty.to_dict(),
                "vs_unquantized": self.vs_unquantized.to_dict() if self.vs_unquantized else None,
                "verdict": self.verdict.word if self.verdict else None, "decision": self.verdict.to_dict() if self.verdict else None}


def penalties(results: Iterable[EvalResult], *, margin: float = DEFAULT_MARGIN,
              replicates: Sequence[Iterable[EvalResult]] = ()) -> list[PenaltyRow]:
    """The KV penalty of every cache under every weight config of a grid, paired by window (``replicates`` pooled).

    "Larger under these weights" is the additivity interaction, decided by the one rule; the
    table's interactions are one Holm family."""
    results = list(results)
    runs = _runs(results, replicates)
    ref = _reference_cell(results)
    base = {r.weights: r for r in results if _is_fp16(r)}
    plain = {r.kv: r for r in results if _is_none(r)}
    found = []
    for r in results:
        if _is_fp16(r) or r.weights not in base:
            continue
        penalty = _pooled(lambda m: m["wc"] - m["w"], _in_runs(runs, {"wc": r, "w": base[r.weights]})).interval()
        test = None
        if not _is_none(r) and r.kv in plain:
            # (wc − w) − (c − ref): the same interaction, on the same windows, as the additivity finding's
            cells = _in_runs(runs, {"ref": ref, "w": base[r.weights], "c": plain[r.kv], "wc": r})
            test = interaction_effect(pooled_effect_draws(cells, "kld"), "kld", r.tokens, margin,
                                      name=f"{r.weights} × {r.kv}")
        found.append((r, penalty, test))
    tests = [t for _, _, t in found if t is not None]
    verdicts = iter(decide(tests, family=f"{ref.model} penalty table"))
    return [PenaltyRow(r.weights, r.kv, penalty, t.draws.interval() if t else None, next(verdicts) if t else None)
            for r, penalty, t in found]


@dataclass(frozen=True)
class MethodDifference:
    """Does the cache cost more under weight method ``a`` than under ``b``? penalty(a) − penalty(b), paired by window."""

    kv: str
    a: str
    b: str
    difference: Interval
    verdict: Verdict

    def to_dict(self) -> dict:
        return {"kv": self.kv, "a": self.a, "b": self.b, "difference": self.difference.to_dict(), "verdict": self.verdict.word,
                "decision": self.verdict.to_dict()}


def method_differences(results: Iterable[EvalResult], *, margin: float = DEFAULT_MARGIN,
                       replicates: Sequence[Iterable[EvalResult]] = ()) -> list[MethodDifference]:
    """Every pair of quantized weight methods, per cache: penalty(a) − penalty(b) = (KLD(a×C) − KLD(a×fp16)) − (KLD(b×C) − KLD(b×fp16)).

    What "the cache hurts more under GPTQ than under RTN" must rest on: a tested difference, not a
    significant row next to a non-significant one. m = ``margin`` × the cache's own KLD (its
    penalty under unquantized weights); all pairs of the table are one Holm family; ``replicates`` pooled."""
    results = list(results)
    runs = _runs(results, replicates)
    ref = _reference_cell(results)
    base = {r.weights: r for r in results if _is_fp16(r)}
    cells = {(r.weights, r.kv): r for r in results if not _is_fp16(r) and r.weights in base}
    methods = [w for w in base if w != ref.weights]
    found = []
    for kv in dict.fromkeys(k for _, k in cells):
        own = cells.get((ref.weights, kv))
        # the cache's own cost on the same units as the differences: the margin's basis, with its uncertainty
        scale = (_pooled(lambda m: m["c"] - m["ref"], _in_runs(runs, {"ref": ref, "c": own})) if own is not None else float("nan"))
        present = [w for w in methods if (w, kv) in cells]
        for i, a in enumerate(present):
            for b in present[i + 1:]:
                four = _in_runs(runs, {"ref": ref, "ac": cells[(a, kv)], "a": base[a], "bc": cells[(b, kv)], "b": base[b]})
                draws = _pooled(lambda m: (m["ac"] - m["a"]) - (m["bc"] - m["b"]), four)
                # one basis text for the family: the table's footnote states it once, and each row's margin column
                # gives that row's m (naming the first row's cache there read as if it held for every row)
                found.append((kv, a, b, MarginRule.parse(margin).difference_effect(
                    f"{kv}: penalty under {a} − under {b}", draws, scale, "KLD(C), the row's cache under unquantized weights", ref.tokens,
                    unit="nats")))
    verdicts = decide([e for *_, e in found], family=f"{ref.model} weight-method differences")
    return [MethodDifference(kv, a, b, e.draws.interval(), v) for (kv, a, b, e), v in zip(found, verdicts)]


@dataclass(frozen=True)
class CalibrationRow:
    """One calibrated method evaluated on one text: KLD per calibration text, and the mismatch's cost."""

    weights: str
    data: str
    kld: dict  # calibration text -> Interval
    mismatch: dict  # calibration text -> Interval of KLD(that text) − KLD(the evaluation's own domain)
    own: str  # the calibration text of the evaluation's own domain
    verdicts: dict = None  # calibration text -> Verdict on the mismatch (the one rule, Holm over the table)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "data": self.data, "own": self.own, "kld": {k: v.to_dict() for k, v in self.kld.items()},
                "mismatch": {k: v.to_dict() for k, v in self.mismatch.items()},
                "verdicts": {k: v.to_dict() for k, v in (self.verdicts or {}).items()}}


CALIBRATION_ORDER = ("prose", "code", "math")  # known texts first, any other calibration text after them by name
OWN_DOMAIN = {"default": "prose", "prose": "prose", "code": "code"}


def calibration(results_by_text: dict[tuple[str, str], list[EvalResult]], *, margin: float = DEFAULT_MARGIN,
                replicates: Sequence[Mapping[tuple[str, str], list[EvalResult]]] = ()) -> list[CalibrationRow]:
    """``results_by_text[(calibration text, evaluation data)]``: one grid each, on the same windows per data;
    ``replicates``: the same grids measured again (each another calibration sample), pooled into every interval.

    A mismatch (KLD calibrated on another text minus calibrated on the evaluation's own domain) is
    decided with m = 10% of the own-domain KLD; the table's mismatches are one Holm family."""
    runs = {key: _runs(results, [run[key] for run in replicates]) for key, results in results_by_text.items()}
    found = []
    datas = sorted({d for _, d in results_by_text})
    calibs = sorted({c for c, _ in results_by_text},
                    key=lambda c: (CALIBRATION_ORDER.index(c) if c in CALIBRATION_ORDER else len(CALIBRATION_ORDER), c))
    for data in datas:
        grids = {c: {r.weights: r for r in results_by_text[(c, data)] if not _is_none(r)} for c in calibs if (c, data) in results_by_text}
        own = OWN_DOMAIN.get(data, next(iter(grids)))
        for weights in sorted(next(iter(grids.values()))):
            cells = {c: g[weights] for c, g in grids.items() if weights in g}
            first = next(iter(cells.values()))
            # each calibration text's cell in every replicate (each text's grid is its own sweep)
            each = [_in_runs(runs[(c, data)], {c: cell}) for c, cell in cells.items()]
            per_run = [{c: r for text in run for c, r in text.items()} for run in zip(*each)]
            check_replicates(per_run)
            kld = {c: _pooled(lambda m, c=c: m[c], per_run) for c in cells}
            mismatch = {c: _pooled(lambda m, c=c: m[c] - m[own], per_run) for c in cells if c != own and own in cells}
            tests = {c: MarginRule.parse(margin).difference_effect(f"{weights} on {data}: calibrated on {c} − on {own}", d, kld[own],
                                                                   f"KLD calibrated on {own}", first.tokens, unit="nats")
                     for c, d in mismatch.items()}
            found.append((weights, data, own, kld, mismatch, tests))
    flat = [t for *_, tests in found for t in tests.values()]
    verdicts = iter(decide(flat, family="calibration table"))
    return [CalibrationRow(weights, data, {c: d.interval() for c, d in kld.items()}, {c: d.interval() for c, d in mismatch.items()}, own,
                           {c: next(verdicts) for c in tests})
            for weights, data, own, kld, mismatch, tests in found]
