"""Tables of the findings, from stored per-token arrays, every number with a paired interval.

All intervals come from :func:`wkvlab.stats.paired_interval` (windows resampled, the same windows
for every config compared — or blocks of positions for depth), so "decided" (an interval exists)
and "significant" (it excludes 0) mean the same thing here as in explain, compare and the report.
The additivity question asks more of an interval: that it be narrower than the smaller main effect
("resolved"); where it is not, the table says how many tokens would resolve it — an interval's
width shrinks with the square root of the resampling units, so ``tokens × (width / target)²``
would bring it to the target.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from wkvlab.errors import DataError
from wkvlab.eval.depth import depth_tables
from wkvlab.eval.result import EvalResult
from wkvlab.explain.factorial import effects
from wkvlab.kv.spec import KVSpec
from wkvlab.stats import Interval, paired_interval
from wkvlab.weights.spec import WeightSpec


def _is_none(result: EvalResult) -> bool:
    return WeightSpec.from_dict(result.weights_spec).is_identity


def _is_fp16(result: EvalResult) -> bool:
    return KVSpec.from_dict(result.kv_spec).is_identity


def tokens_to_decide(interval: Interval, target: float, tokens: int) -> int | None:
    """Tokens at which an interval as wide as this one would be ``target`` wide (None: it already
    is, or there is no interval to scale)."""
    width = interval.high - interval.low
    if not interval.decided or not math.isfinite(width) or target <= 0:
        return None
    return None if width < target else int(math.ceil(tokens * (width / target) ** 2))


@dataclass(frozen=True)
class AdditivityRow:
    weights: str
    kv: str
    w: Interval  # KLD of the weights with a 16-bit cache
    c: Interval  # KLD of the cache with unquantized weights
    wc: Interval  # KLD of both
    interaction: Interval  # wc − w − c
    tokens: int

    @property
    def share(self) -> float:
        """The interaction as a share of the sum of the main effects."""
        total = self.w.estimate + self.c.estimate
        return self.interaction.estimate / total if total else float("nan")

    @property
    def smaller_effect(self) -> float:
        return min(abs(self.w.estimate), abs(self.c.estimate))

    @property
    def resolved(self) -> bool:
        """The interaction's interval is narrower than the smaller main effect (the issue's criterion)."""
        return self.interaction.decided and (self.interaction.high - self.interaction.low) < self.smaller_effect

    @property
    def verdict(self) -> str:
        """The interval's sign when it excludes 0; "additive" only when it is also resolved."""
        if not self.interaction.decided:
            return "too few windows for an interval"
        if self.interaction.low > 0:
            return "compounds (more than the sum)"
        if self.interaction.high < 0:
            return "less than the sum"
        return "additive within the interval" if self.resolved else "not resolved (interval wider than the smaller effect)"

    @property
    def tokens_needed(self) -> int | None:
        return None if self.resolved else tokens_to_decide(self.interaction, self.smaller_effect, self.tokens)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, **{k: getattr(self, k).to_dict() for k in ("w", "c", "wc", "interaction")},
                "tokens": self.tokens, "share": self.share, "resolved": self.resolved, "verdict": self.verdict,
                "tokens_needed": self.tokens_needed}


def _reference_cell(results: list[EvalResult]) -> EvalResult:
    """The grid's unquantized weights × 16-bit cache: the factorial's reference cell."""
    ref = next((r for r in results if _is_none(r) and _is_fp16(r)), None)
    if ref is None:
        raise DataError("the grid has no unquantized weights × fp16 cell; add weights 'none' and kv 'fp16' to it")
    return ref


def additivity(results: Iterable[EvalResult], *, n_resamples: int = 2000) -> list[AdditivityRow]:
    """The 2×2 factorial of every (W, C) pair of a weights × KV grid that holds none and fp16."""
    results = list(results)
    ref = _reference_cell(results)
    by_w = {r.weights: r for r in results if _is_fp16(r) and not _is_none(r)}
    by_c = {r.kv: r for r in results if _is_none(r) and not _is_fp16(r)}
    rows = []
    for r in results:
        if _is_none(r) or _is_fp16(r) or r.weights not in by_w or r.kv not in by_c:
            continue
        e = effects({"ref": ref, "w": by_w[r.weights], "c": by_c[r.kv], "wc": r}, "kld", n_resamples=n_resamples)
        rows.append(AdditivityRow(r.weights, r.kv, e.w, e.c, e.wc, e.interaction, r.tokens))
    return rows


@dataclass(frozen=True)
class PenaltyRow:
    """What a cache adds under one weight config: KLD(W × C) − KLD(W × fp16), and against unquantized weights."""

    weights: str
    kv: str
    penalty: Interval
    vs_unquantized: Interval | None  # penalty under W minus penalty under unquantized weights: the additivity interaction

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "penalty": self.penalty.to_dict(),
                "vs_unquantized": self.vs_unquantized.to_dict() if self.vs_unquantized else None}


def penalties(results: Iterable[EvalResult], *, n_resamples: int = 2000) -> list[PenaltyRow]:
    """The KV penalty of every cache under every weight config of a grid, paired by window."""
    results = list(results)
    ref = _reference_cell(results)
    base = {r.weights: r for r in results if _is_fp16(r)}
    plain = {r.kv: r for r in results if _is_none(r)}
    rows = []
    for r in results:
        if _is_fp16(r) or r.weights not in base:
            continue
        arrays = {"wc": r.arrays.kld, "w": base[r.weights].arrays.kld}
        penalty = paired_interval(lambda m: m["wc"] - m["w"], arrays, r.arrays.window, n_resamples=n_resamples)
        versus = None
        if not _is_none(r) and r.kv in plain:
            # (wc − w) − (c − ref): the same interaction, on the same windows, as the additivity finding's
            versus = effects({"ref": ref, "w": base[r.weights], "c": plain[r.kv], "wc": r}, "kld", n_resamples=n_resamples).interaction
        rows.append(PenaltyRow(r.weights, r.kv, penalty, versus))
    return rows


@dataclass(frozen=True)
class CalibrationRow:
    """One calibrated method evaluated on one text: KLD per calibration text, and the mismatch's cost."""

    weights: str
    data: str
    kld: dict  # calibration text -> Interval
    mismatch: dict  # calibration text -> Interval of KLD(that text) − KLD(the evaluation's own domain)
    own: str  # the calibration text of the evaluation's own domain

    def to_dict(self) -> dict:
        return {"weights": self.weights, "data": self.data, "own": self.own, "kld": {k: v.to_dict() for k, v in self.kld.items()},
                "mismatch": {k: v.to_dict() for k, v in self.mismatch.items()}}


def calibration(results_by_text: dict[tuple[str, str], list[EvalResult]], *, n_resamples: int = 2000) -> list[CalibrationRow]:
    """``results_by_text[(calibration text, evaluation data)]``: one grid each, on the same windows per data."""
    own_domain = {"default": "prose", "prose": "prose", "code": "code"}
    rows = []
    datas = sorted({d for _, d in results_by_text})
    calibs = sorted({c for c, _ in results_by_text}, key=("prose", "code", "math").index)
    for data in datas:
        grids = {c: {r.weights: r for r in results_by_text[(c, data)] if not _is_none(r)} for c in calibs if (c, data) in results_by_text}
        own = own_domain.get(data, calibs[0])
        for weights in sorted(next(iter(grids.values()))):
            cells = {c: g[weights] for c, g in grids.items() if weights in g}
            units = next(iter(cells.values())).arrays.window
            arrays = {c: r.arrays.kld for c, r in cells.items()}
            kld = {c: paired_interval(lambda m, c=c: m[c], arrays, units, n_resamples=n_resamples) for c in cells}
            mismatch = {c: paired_interval(lambda m, c=c: m[c] - m[own], arrays, units, n_resamples=n_resamples)
                        for c in cells if c != own and own in cells}
            rows.append(CalibrationRow(weights, data, kld, mismatch, own))
    return rows


def depth(results: Iterable[EvalResult]) -> list[dict]:
    return [t.to_dict() for t in depth_tables(list(results))]
