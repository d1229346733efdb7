"""The 2×2 factorial at the output: {reference, W} weights × {reference, C} cache on the same tokens.

Each metric is read as an *effect*, the cell's value minus the identity cell's (weights ``none``,
cache ``fp16``), so KLD, PPL and top-1 are treated alike:

    effect(W), effect(C), effect(W+C)  and  interaction = effect(W+C) − effect(W) − effect(C)

An interaction of zero means the two errors add; above zero, the combination costs more than the
sum (the cross term ε_q·ε_kᵀ and shared outlier channels are the suspects, see attention.py).
For top-1 the effect is the *loss* of agreement (1 − agreement), so positive is worse everywhere.

Every number comes with a paired analytic interval (:mod:`wkvlab.stats`: no resampling, no
Monte-Carlo error) over documents where the text has them, windows otherwise
(:attr:`wkvlab.eval.TokenArrays.units`): all four cells were scored on the same tokens, and every
statistic is computed on the same units for all of them.
Interactions are decided by the one rule (:func:`wkvlab.stats.decide`) only on scales where
"additive" means "the two errors do not interact" (issue #38):

* **KLD** — as measured; margin ±m from ``margin`` (:class:`~wkvlab.stats.decision.MarginRule`: by
  default 10% of the predicted total KLD(W) + KLD(C));
* **PPL** — on its log, the mean NLL: log PPL(W+C) − log PPL(W) − log PPL(C) + log PPL(ref). On
  PPL itself two errors that each multiply PPL by e^b and e^c, independently, show an "interaction"
  e^a(e^b − 1)(e^c − 1): a property of the exponential, not of the errors. The W, C, W+C columns stay
  in PPL; the interaction, its ratio and its verdict are in nats of NLL;
* **top-1** — no verdict: two independent errors that flip a token with probabilities p and q lose
  p + q − pq of the agreement, an "interaction" of −pq from the scale alone. The interaction is
  printed as a description, never decided.

The KLD and NLL interactions of one factorial form one Holm family. Without an interval (fewer than
8 units) the verdict is *undecided*, never *additive*.

**Replicates** (``replicates``): the four cells measured again with another calibration sample (for the
configs that have one) and another float order (chunk size), on the same units. Every effect is then
the mean over the replicates, and its interval holds the between-replicate variance too
(:func:`wkvlab.stats.bootstrap.pool`, :mod:`wkvlab.stats.replicates`): the verdict is about the
method and config, not about one build and one run of it.
One ``run_grid`` call with weights ``[none, W]`` and KV ``[fp16, C]`` yields the four cells; the
identity cell is computed too (its KLD is exactly zero when the hook is exact — a built-in check).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from wkvlab.errors import DataError
from wkvlab.eval.result import EvalResult
from wkvlab.kv.spec import KVSpec
from wkvlab.stats import Interval, Resampled, resample
from wkvlab.stats.bootstrap import pool
from wkvlab.stats.decision import DEFAULT_MARGIN, Effect, MarginRule, Verdict, decide
from wkvlab.weights.spec import WeightSpec

CELLS = ("ref", "w", "c", "wc")  # grid order of run_grid([none, W], [fp16, C])
METRICS = ("kld", "ppl", "top1")
METRIC_LABELS = {"kld": "KLD", "ppl": "PPL", "top1": "top-1 loss"}
DECIDED = ("kld", "ppl")  # metrics whose interaction is decided (PPL's on the NLL scale); top-1: described only
INTERACTION_LABELS = {"kld": "KLD", "ppl": "NLL (mean log-loss)", "top1": "top-1 loss"}
NO_TOP1_VERDICT = ("no verdict: on top-1 agreement two independent errors lose p + q − pq, an interaction of −pq that "
                   "the scale makes, not the errors")


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
    """Mean of a metric's per-token array → the metric (exp for PPL; numpy, so it works on the leave-one-out means)."""
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


def effect_draws(cells: Mapping[str, EvalResult], metric: str) -> dict[str, Resampled]:
    """Bootstrap draws of effect(W), effect(C), effect(W+C), the interaction and the ratio (paired over units)."""
    arrays = metric_arrays(cells, metric)
    units = cells["ref"].arrays.units
    f = metric_value(metric)

    def effect(name: str) -> Callable:
        return lambda m: f(m[name]) - f(m["ref"])

    w, c, wc = effect("w"), effect("c"), effect("wc")
    # the interaction and its ratio on the additive scale: the mean NLL (log PPL) for PPL, see the module docstring
    log = (lambda name: lambda m: m[name] - m["ref"]) if metric == "ppl" else effect
    lw, lc, lwc = log("w"), log("c"), log("wc")
    statistics = {"w": w, "c": c, "wc": wc, "interaction": lambda m: lwc(m) - lw(m) - lc(m),
                  "ratio": lambda m: lwc(m) / (lw(m) + lc(m)),  # NaN when both effects are 0
                  "w_log": lw, "c_log": lc, "total": lambda m: lw(m) + lc(m)}  # total: what the default margin is a share of
    return {name: resample(stat, arrays, units) for name, stat in statistics.items()}


def pooled_effect_draws(replicates: "Sequence[Mapping[str, EvalResult]]", metric: str) -> dict[str, Resampled]:
    """:func:`effect_draws` of every replicate's cells, pooled (one replicate: its own draws)."""
    each = [effect_draws(cells, metric) for cells in replicates]
    return {name: pool([d[name] for d in each]) for name in each[0]}


def interaction_effect(draws: Mapping[str, Resampled], metric: str, tokens: int, margin: "float | str | MarginRule" = DEFAULT_MARGIN,
                       name: str | None = None) -> Effect:
    """The interaction as an effect for :func:`wkvlab.stats.decide`, m by ``margin`` (:class:`MarginRule`)
    from the single effects on the interaction's own scale (NLL for PPL)."""
    label = INTERACTION_LABELS[metric].split(" ")[0]
    w_draws, c_draws = (draws["w_log"], draws["c_log"]) if "w_log" in draws else (draws["w"], draws["c"])
    return MarginRule.parse(margin).interaction_effect(name or f"{INTERACTION_LABELS[metric]} interaction", draws["interaction"],
                                                       w_draws, c_draws, tokens, label=label, total=draws.get("total"))


def _effects(metric: str, reference: float, draws: Mapping[str, Resampled], verdict: Verdict | None) -> Effects:
    return Effects(metric, reference, *(draws[k].interval() for k in ("w", "c", "wc", "interaction", "ratio")), verdict)


def _reference_value(cells: Mapping[str, EvalResult], metric: str) -> float:
    return float(metric_value(metric)(metric_arrays({"ref": cells["ref"]}, metric)["ref"].mean()))


def effects(cells: Mapping[str, EvalResult], metric: str, *,
            margin: "float | str | MarginRule" = DEFAULT_MARGIN) -> Effects:
    """Effects of W, C, W+C and their interaction for one metric; the interaction decided alone (a family
    of one), except top-1's, which is never decided (see the module docstring)."""
    draws = effect_draws(cells, metric)
    verdict = decide([interaction_effect(draws, metric, cells["ref"].tokens, margin)])[0] if metric in DECIDED else None
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
    replicates: int = 1  # measurements pooled into every interval (0: stored before replicates existed)
    variation: str = ""  # what differs between them (calibration samples, chunk sizes)

    def metric(self, name: str) -> Effects:
        return {"kld": self.kld, "ppl": self.ppl, "top1": self.top1}[name]

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("model", "data", "weights", "kv", "ctx", "tokens", "windows", "identity_kld_max",
                                                 "replicates", "variation")}
        return {**data, **{m: self.metric(m).to_dict() for m in METRICS}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Factorial":
        plain = {k: data[k] for k in ("model", "data", "weights", "kv", "ctx", "tokens", "windows", "identity_kld_max")}
        return cls(**plain, **{m: Effects.from_dict(data[m]) for m in METRICS}, replicates=data.get("replicates", 0),
                   variation=data.get("variation", ""))


def factorial(cells: Mapping[str, EvalResult], *, margin: "float | str | MarginRule" = DEFAULT_MARGIN,
              replicates: Sequence[Mapping[str, EvalResult]] = (), variation: str = "") -> Factorial:
    """The factorial from four results scored on the same tokens (see :func:`cells_from_grid`).

    ``replicates``: more sets of the four cells on the same tokens (another calibration sample, another float
    order; ``variation`` says which), pooled with ``cells`` into every interval (see the module docstring).
    The KLD and NLL (log PPL) interactions are one family, Holm-adjusted together; top-1's is described only."""
    from wkvlab.explain.compare import check_replicates  # one definition of "same tokens", within and across runs

    missing = [name for name in CELLS if name not in cells]
    if missing:
        raise DataError(f"factorial cells missing: {', '.join(missing)}; evaluate weights [none, W] × KV [fp16, C]")
    runs = [cells, *replicates]
    check_replicates([{name: run[name] for name in CELLS} for run in runs])
    ref, wc = cells["ref"], cells["wc"]
    draws = {m: pooled_effect_draws(runs, m) for m in METRICS}
    decided = decide([interaction_effect(draws[m], m, ref.tokens, margin) for m in DECIDED],
                     family=f"{wc.weights} × {wc.kv}: KLD and NLL interactions")
    verdicts = [dict(zip(DECIDED, decided)).get(m) for m in METRICS]
    return Factorial(
        model=ref.model, data=ref.data, weights=wc.weights, kv=wc.kv, ctx=ref.ctx, tokens=ref.tokens,
        windows=int(np.unique(ref.arrays.window).size),
        identity_kld_max=float(np.abs(ref.arrays.kld).max()) if ref.tokens else 0.0,
        **{m: _effects(m, _reference_value(cells, m), draws[m], v) for m, v in zip(METRICS, verdicts)},
        replicates=len(runs), variation=variation,
    )
