"""The 2×2 factorial at the output: {reference, W} weights × {reference, C} cache on the same tokens.

Each metric is read as an *effect*, the cell's value minus the identity cell's (weights ``none``,
cache ``fp16``), so KLD, PPL and top-1 are treated alike:

    effect(W), effect(C), effect(W+C)  and  interaction = effect(W+C) − effect(W) − effect(C)

An interaction of zero means the two errors add; above zero, the combination costs more than the
sum (the cross term ε_q·ε_kᵀ and shared outlier channels are the suspects, see attention.py).
For top-1 the effect is the *loss* of agreement (1 − agreement), so positive is worse everywhere.

Every number comes with a paired bootstrap interval (:mod:`wkvlab.stats`) over documents where the
text has them, windows otherwise (:attr:`wkvlab.eval.TokenArrays.units`): all four cells were
scored on the same tokens, and one resample draws the same units for all of them.
Each interaction is decided by the one rule (:func:`wkvlab.stats.decide`): margin ±m = 10% (the
``margin`` argument) of the cache's own effect on that metric, and the three interactions of one
factorial (KLD, PPL, top-1) form one Holm family. Without an interval (fewer than 8 units) the
verdict is *undecided*, never *additive*.
One ``run_grid`` call with weights ``[none, W]`` and KV ``[fp16, C]`` yields the four cells; the
identity cell is computed too (its KLD is exactly zero when the hook is exact — a built-in check).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from wkvlab.errors import DataError
from wkvlab.eval.result import EvalResult
from wkvlab.kv.spec import KVSpec
from wkvlab.stats import Interval, Resampled, resample
from wkvlab.stats.decision import DEFAULT_MARGIN, INTERACTION, Effect, Margin, Verdict, decide
from wkvlab.weights.spec import WeightSpec

CELLS = ("ref", "w", "c", "wc")  # grid order of run_grid([none, W], [fp16, C])
METRICS = ("kld", "ppl", "top1")
METRIC_LABELS = {"kld": "KLD", "ppl": "PPL", "top1": "top-1 loss"}


def factorial_specs(weights: WeightSpec, kv: KVSpec) -> tuple[list[WeightSpec], list[KVSpec]]:
    """The run_grid arguments whose results, in grid order, are the cells ref, C, W, W+C."""
    return [WeightSpec.parse("none"), weights], [KVSpec.parse("fp16"), kv]


def cells_from_grid(results: list[EvalResult]) -> dict[str, EvalResult]:
    """Name the four results of ``run_grid(*factorial_specs(W, C))`` (grid order: ref, C, W, W+C)."""
    if len(results) != 4:
        raise DataError(f"a factorial needs the 4 results of a 2×2 grid, got {len(results)}")
    ref, c, w, wc = results
    return {"ref": ref, "w": w, "c": c, "wc": wc}


def metric_arrays(cells: Mapping[str, EvalResult], metric: str) -> dict[str, np.ndarray]:
    """Per-token arrays whose token-weighted means give the metric of each cell.

    KLD: per-token KLD. PPL: per-token NLL (PPL = exp of its mean). top-1: 1 − agreement.
    """
    def one(result: EvalResult) -> np.ndarray:
        a = result.arrays
        if metric == "kld":
            return a.kld
        if metric == "ppl":
            return a.nll
        if metric == "top1":
            return 1.0 - a.top1_agree.astype(np.float64)
        raise ValueError(f"unknown metric {metric!r}")

    return {name: one(result) for name, result in cells.items()}


def metric_value(metric: str) -> Callable:
    """Mean of a metric's per-token array → the metric (exp for PPL; numpy, so it works on resamples)."""
    return np.exp if metric == "ppl" else (lambda m: m)


@dataclass(frozen=True)
class Effects:
    """One metric's effects and interaction, each with its paired interval, and the interaction's verdict."""

    metric: str
    reference: float  # the identity cell's value (KLD 0, reference PPL, top-1 loss 0)
    w: Interval
    c: Interval
    wc: Interval
    interaction: Interval
    ratio: Interval  # effect(W+C) / (effect(W) + effect(C)): 1 = additive
    verdict: Verdict | None = None  # the one rule's decision (None: stored before it existed)

    @property
    def additive(self) -> bool:
        """True only when the family-adjusted interval of the interaction lies inside ±m."""
        return self.verdict is not None and self.verdict.outcome == "within"

    @property
    def word(self) -> str:
        return self.verdict.word if self.verdict is not None else "undecided"

    def to_dict(self) -> dict:
        return {"metric": self.metric, "reference": self.reference,
                **{k: getattr(self, k).to_dict() for k in ("w", "c", "wc", "interaction", "ratio")},
                "verdict": self.verdict.to_dict() if self.verdict is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Effects":
        verdict = Verdict.from_dict(data["verdict"]) if data.get("verdict") else None
        return cls(data["metric"], data["reference"], *(Interval.from_dict(data[k]) for k in ("w", "c", "wc", "interaction", "ratio")),
                   verdict)


def effect_draws(cells: Mapping[str, EvalResult], metric: str, *, n_resamples: int = 2000, seed: int | None = None) -> dict[str, Resampled]:
    """Bootstrap draws of effect(W), effect(C), effect(W+C), the interaction and the ratio (paired over units)."""
    arrays = metric_arrays(cells, metric)
    units = cells["ref"].arrays.units
    f = metric_value(metric)

    def effect(name: str) -> Callable:
        return lambda m: f(m[name]) - f(m["ref"])

    w, c, wc = effect("w"), effect("c"), effect("wc")
    statistics = {"w": w, "c": c, "wc": wc, "interaction": lambda m: wc(m) - w(m) - c(m),
                  "ratio": lambda m: wc(m) / (w(m) + c(m))}  # NaN when both effects are 0
    return {name: resample(stat, arrays, units, n_resamples=n_resamples, seed=seed) for name, stat in statistics.items()}


def interaction_effect(draws: Mapping[str, Resampled], metric: str, tokens: int, margin: float = DEFAULT_MARGIN,
                       name: str | None = None) -> Effect:
    """The interaction as an effect for :func:`wkvlab.stats.decide`: m = ``margin`` × |effect(C)|."""
    label = METRIC_LABELS[metric]
    return Effect(name or f"{label} interaction", draws["interaction"], Margin.relative_to(draws["c"].estimate, f"{label}(C)", margin),
                  tokens, INTERACTION)


def _effects(metric: str, reference: float, draws: Mapping[str, Resampled], verdict: Verdict | None) -> Effects:
    return Effects(metric, reference, *(draws[k].interval() for k in ("w", "c", "wc", "interaction", "ratio")), verdict)


def _reference_value(cells: Mapping[str, EvalResult], metric: str) -> float:
    return float(metric_value(metric)(metric_arrays({"ref": cells["ref"]}, metric)["ref"].mean()))


def effects(cells: Mapping[str, EvalResult], metric: str, *, n_resamples: int = 2000, seed: int | None = None,
            margin: float = DEFAULT_MARGIN) -> Effects:
    """Effects of W, C, W+C and their interaction for one metric; the interaction decided alone (a family of one)."""
    draws = effect_draws(cells, metric, n_resamples=n_resamples, seed=seed)
    verdict = decide([interaction_effect(draws, metric, cells["ref"].tokens, margin)])[0]
    return _effects(metric, _reference_value(cells, metric), draws, verdict)


@dataclass(frozen=True)
class Factorial:
    """The 2×2 factorial of one weight config W and one KV config C on one model and text."""

    model: str
    data: str
    weights: str
    kv: str
    ctx: int
    tokens: int
    windows: int
    identity_kld_max: float  # largest per-token KLD of the identity cell: 0 when the hook is exact
    kld: Effects
    ppl: Effects
    top1: Effects

    def metric(self, name: str) -> Effects:
        return {"kld": self.kld, "ppl": self.ppl, "top1": self.top1}[name]

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("model", "data", "weights", "kv", "ctx", "tokens", "windows", "identity_kld_max")}
        return {**data, **{m: self.metric(m).to_dict() for m in METRICS}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Factorial":
        plain = {k: data[k] for k in ("model", "data", "weights", "kv", "ctx", "tokens", "windows", "identity_kld_max")}
        return cls(**plain, **{m: Effects.from_dict(data[m]) for m in METRICS})


def factorial(cells: Mapping[str, EvalResult], *, n_resamples: int = 2000, seed: int | None = None,
              margin: float = DEFAULT_MARGIN) -> Factorial:
    """The factorial from four results scored on the same tokens (see :func:`cells_from_grid`).

    The three interactions (KLD, PPL, top-1) are one family: Holm-adjusted together."""
    from wkvlab.explain.compare import check_same_tokens  # one definition of "same tokens"

    missing = [name for name in CELLS if name not in cells]
    if missing:
        raise DataError(f"factorial cells missing: {', '.join(missing)}; evaluate weights [none, W] × KV [fp16, C]")
    for name in ("w", "c", "wc"):
        check_same_tokens(cells["ref"], cells[name])
    ref, wc = cells["ref"], cells["wc"]
    draws = {m: effect_draws(cells, m, n_resamples=n_resamples, seed=seed) for m in METRICS}
    verdicts = decide([interaction_effect(draws[m], m, ref.tokens, margin) for m in METRICS],
                      family=f"{wc.weights} × {wc.kv}: KLD, PPL, top-1 interactions")
    return Factorial(
        model=ref.model, data=ref.data, weights=wc.weights, kv=wc.kv, ctx=ref.ctx, tokens=ref.tokens,
        windows=int(np.unique(ref.arrays.window).size),
        identity_kld_max=float(np.abs(ref.arrays.kld).max()) if ref.tokens else 0.0,
        **{m: _effects(m, _reference_value(cells, m), draws[m], v) for m, v in zip(METRICS, verdicts)},
    )
