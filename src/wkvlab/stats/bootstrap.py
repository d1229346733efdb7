"""Paired bootstrap over evaluation units (windows or documents), studentized.

Tokens inside one window are strongly correlated (one bad early token shifts all later ones), so a
standard error over tokens is far too optimistic. The unit of resampling is therefore the
**document** where the text has them (windows of one document share its difficulty: resampling
them as if independent under-covers, tests/stats/test_documents.py), and the window where the text
is one stream (:class:`Units` says which, and every interval prints it). Every config compared was
scored on the same units, and one resample draws the same units for all of them (paired), which
cancels the unit-to-unit variation they share.

Every statistic here is a function of token-weighted means of per-token arrays (mean KLD, mean NLL →
PPL = exp(mean NLL), top-1 agreement, and differences or interactions of those). A resample is a
vector of multiplicities per unit (multinomial), so the resampled means of any array are one matrix
product, and any function of the means (for example ``m["wc"] - m["w"] - m["c"]``) is evaluated on
all resamples at once.

**The interval every verdict is read from is analytic** (:mod:`wkvlab.stats.skewt`): Student's t
on the jackknife standard error over units, each side widened by a skewness allowance, so that the
error control holds at the family-adjusted levels where verdicts are made, not only at 95%, and no
bound depends on a seed (issue #38; docs/stats.md). :func:`resample` computes what it needs: the
estimate, the jackknife SE and the skewness of the units' jackknife influence values. The
studentized bootstrap (Efron & Tibshirani 1993, ch. 12) remains for the two-stage design
(:mod:`wkvlab.stats.twostage`), where the units are crossed and no closed form applies; its
``Resampled`` carries its sorted t draws and the Monte-Carlo error of its bounds is printed with them.

Below :data:`MIN_UNITS` units no interval is computed (the estimate is still given) and nothing is
decided. When the statistic is not finite with some unit left out (a bucket only that unit has, a
ratio of zeros) there is no interval either, and ``Interval.dropped`` counts those units.
Decisions (margins, families, verdicts) live in :mod:`wkvlab.stats.decision`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats import skewt

DEFAULT_RESAMPLES = 2000
MIN_UNITS = 8  # fewer resampling units: no interval, no verdict (see the module docstring)
BOOTSTRAP = "studentized bootstrap (jackknife SE within each resample)"
METHOD = skewt.METHOD


@dataclass(frozen=True, eq=False)
class Units:
    """A resampling-unit label per token and what the units are (``documents``, ``windows``, ...).

    :func:`resample` takes these or a bare label array (whose units are called ``units``)."""

    labels: np.ndarray
    kind: str = "units"


def unit_labels(units) -> tuple[np.ndarray, str]:
    """(labels, kind) of a :class:`Units` or a bare label array."""
    if isinstance(units, Units):
        return np.asarray(units.labels), units.kind
    return np.asarray(units), "units"


@dataclass(frozen=True)
class Interval:
    """A point estimate with a studentized bootstrap interval, or none (NaN bounds).

    No interval when there are fewer than :data:`MIN_UNITS` units, or when the statistic was
    undefined on most resamples (say a ratio whose denominator is 0): such an interval decides
    nothing, and its missing bounds must never read as "excludes 0". ``dropped`` counts the
    resamples left out because the statistic or its standard error was not finite."""

    estimate: float
    low: float
    high: float
    level: float
    n_units: int
    n_resamples: int
    dropped: int = 0
    unit: str = "units"  # what was resampled: documents, windows, blocks (see Units)
    method: str = ""  # skewt.METHOD (analytic) or BOOTSTRAP; "" in records stored before issue #38
    mc_error: float = 0.0  # Monte-Carlo standard error of the bounds (0 for the analytic interval)

    @property
    def decided(self) -> bool:
        """Enough resampling units for an interval (:data:`MIN_UNITS`) and finite bounds."""
        return self.n_units >= MIN_UNITS and math.isfinite(self.low) and math.isfinite(self.high)

    def contains(self, value: float = 0.0) -> bool:
        """Whether ``value`` is inside the interval; an undecided interval excludes nothing."""
        return not self.decided or self.low <= value <= self.high

    @property
    def excludes_zero(self) -> bool:
        """True when the difference this interval describes is distinguishable from zero."""
        return not self.contains(0.0)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2 if self.decided else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready: an undecided interval's missing bounds are None (null), not NaN."""
        data = asdict(self)
        for end in ("estimate", "low", "high"):
            if data[end] != data[end]:  # NaN
                data[end] = None
        return {**data, "decided": self.decided}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Interval":
        # JSON writes missing bounds as null; results stored before ``dropped`` existed have none
        fields = {k: data.get(k, 0) for k in cls.__dataclass_fields__}
        fields["unit"] = data.get("unit") or "units"
        fields["method"] = data.get("method") or ""
        return cls(**{k: float("nan") if v is None else v for k, v in fields.items()})

    @property
    def drops(self) -> str:
        """``0 of 2000 resamples dropped`` (bootstrap), ``1 unit leaves it undefined`` (analytic); "" when none."""
        if self.n_resamples:
            return f"{self.dropped} of {self.n_resamples} resamples dropped"
        return f"{self.dropped} {self.unit} left out leave it undefined" if self.dropped else ""

    @property
    def precision(self) -> str:
        """How the bounds were computed and their Monte-Carlo error, for every printed interval."""
        if self.method == BOOTSTRAP:
            return f"{BOOTSTRAP}, {self.n_resamples} resamples, Monte-Carlo SE of the bounds {self.mc_error:.2g}"
        return self.method or "studentized bootstrap (stored before issue #38)"

    def __format__(self, spec: str) -> str:
        spec = spec or ".4g"
        if self.n_units < MIN_UNITS:
            return f"{self.estimate:{spec}} [no interval: {self.n_units} < {MIN_UNITS} {self.unit}]"
        if not self.decided:
            return f"{self.estimate:{spec}} [no interval: undefined " + (f"on {self.dropped} of {self.n_resamples} resamples]" if self.n_resamples
                                                                           else f"with {self.dropped} of {self.n_units} {self.unit} left out]")
        dropped = f" ({self.dropped} of {self.n_resamples} resamples dropped)" if self.dropped else ""
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]{dropped}"


def per_unit(arrays: Mapping[str, np.ndarray], units) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Tokens per unit and each array's sum per unit (units in sorted label order)."""
    units = unit_labels(units)[0]
    for name, values in arrays.items():
        if np.shape(values) != units.shape:
            raise DataError(f"'{name}' has {np.size(values)} tokens but the units have {units.size}: "
                            "compare only results evaluated on the same tokens")
    labels, inverse = np.unique(units, return_inverse=True)
    counts = np.bincount(inverse, minlength=labels.size).astype(np.float64)
    return counts, {name: np.bincount(inverse, weights=np.asarray(v, dtype=np.float64), minlength=labels.size) for name, v in arrays.items()}


def _statistic_on(statistic: Callable, means: Mapping[str, np.ndarray], shape: tuple) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.broadcast_to(np.asarray(statistic(means), dtype=np.float64), shape)


@dataclass(frozen=True, eq=False)
class Resampled:
    """A statistic's estimate and jackknife SE, and what its interval at any level is computed from.

    ``method`` :data:`METHOD` (what :func:`resample` gives): the analytic skew-robust t interval from
    ``se`` and ``skew`` (the skewness of the units' jackknife influence values). ``method``
    :data:`BOOTSTRAP` (the two-stage design): the sorted studentized resamples ``t``. Intervals at any
    level come from the same numbers, which is what a family adjustment needs: the adjusted interval
    is the same interval at a stricter level."""

    estimate: float
    se: float
    t: np.ndarray
    n_units: int
    n_resamples: int
    dropped: int
    unit: str = "units"
    skew: float = 0.0
    method: str = BOOTSTRAP
    influence: np.ndarray | None = None  # per-unit jackknife influence values (analytic): what combine() adds

    def shifted(self, by: float) -> "Resampled":
        """The draws of the statistic + ``by`` (a constant: same SE, skewness and t draws)."""
        return replace(self, estimate=self.estimate + by)

    def combine(self, other: "Resampled", coef: float) -> "Resampled | None":
        """Draws of this statistic + ``coef`` × ``other``, both from the same units (their influence values add);
        None when either has no influence values (a bootstrap, too few units) or the units differ."""
        a, b = self.influence, other.influence
        if a is None or b is None or a.shape != b.shape or not (self.usable and other.usable):
            return None
        return _from_influence(self.estimate + coef * other.estimate, a + coef * b, self.n_units, self.unit)

    @property
    def analytic(self) -> bool:
        return self.method != BOOTSTRAP

    @property
    def usable(self) -> bool:
        if self.n_units < MIN_UNITS or not math.isfinite(self.se):
            return False
        return self.dropped == 0 if self.analytic else (self.t.size > 0 and 2 * self.dropped <= self.n_resamples)

    def _none(self, level: float) -> Interval:
        return Interval(self.estimate, float("nan"), float("nan"), level, self.n_units, self.n_resamples, self.dropped, self.unit,
                        self.method)

    def interval(self, level: float = 0.95) -> Interval:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if not self.usable:
            return self._none(level)
        if self.se == 0.0:  # every unit agrees (identical configs, a constant shift): the point
            return Interval(self.estimate, self.estimate, self.estimate, level, self.n_units, self.n_resamples, self.dropped,
                            self.unit, self.method)
        if self.analytic:
            low, high = skewt.bounds(self.estimate, self.se, self.skew, self.n_units, level)
            return Interval(self.estimate, float(low), float(high), level, self.n_units, 0, 0, self.unit, self.method)
        tail = (1.0 - level) / 2.0
        t_low, t_high = np.quantile(self.t, [tail, 1.0 - tail])
        low, high = self.estimate - t_high * self.se, self.estimate - t_low * self.se
        return Interval(self.estimate, float(low), float(high), level, self.n_units, self.n_resamples, self.dropped, self.unit,
                        self.method, self._mc_error(tail))

    def _mc_error(self, tail: float) -> float:
        """Monte-Carlo SE of the bounds: the spread of the order statistics a binomial ±1 SE of draws away.

        The b-th smallest of B draws estimates the b/B quantile; which draw lands there is binomial, with
        SE √(B·p(1−p)) draws. Half the distance between the draws that far either side, times se, is the
        SE of the bound; the larger of the two tails is reported."""
        size = self.t.size
        out = 0.0
        for p in (tail, 1.0 - tail):
            k = math.sqrt(size * p * (1 - p))
            lo, hi = max(0, int(math.floor(p * size - k))), min(size - 1, int(math.ceil(p * size + k)))
            out = max(out, (self.t[hi] - self.t[lo]) / 2 * self.se)
        return float(out)

    def tail_beyond(self, threshold: float, side: str) -> float:
        """The two-sided level α at which the interval's ``side`` bound reaches ``threshold``.

        ``side="low"``: smallest α whose interval has low > threshold; ``"high"``: high < threshold.
        1 when no level does (at most 1), 0 when every level does."""
        if not self.usable:
            return 1.0
        if self.se == 0.0:
            inside = self.estimate > threshold if side == "low" else self.estimate < threshold
            return 0.0 if inside else 1.0
        if self.analytic:
            return skewt.tail_beyond(self.estimate, self.se, self.skew, self.n_units, threshold, side)
        z = (self.estimate - threshold) / self.se
        # low_α = θ̂ − Q(1−α/2)·se > thr ⟺ Q(1−α/2) < z ⟺ α > 2·(1 − F(z)); high_α < thr ⟺ α > 2·F(z), with F the
        # inverse of np.quantile's linear interpolation, so the level found is exactly where interval() starts deciding
        cdf = float(np.interp(z, self.t, np.linspace(0.0, 1.0, self.t.size))) if self.t.size > 1 else float(z > self.t[0])
        return min(1.0, 2.0 * (1.0 - cdf) if side == "low" else 2.0 * cdf)


def _leave_one_out(statistic: Callable, sums: Mapping[str, np.ndarray], counts: np.ndarray) -> np.ndarray:
    """The statistic with each unit left out in turn (one value per unit)."""
    total_c = counts.sum() - counts
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {k: (s.sum() - s) / total_c for k, s in sums.items()}
    return _statistic_on(statistic, means, counts.shape)


def resample(
    statistic: Callable[[Mapping[str, np.ndarray | float]], np.ndarray | float],
    arrays: Mapping[str, np.ndarray],
    units,
    *,
    n_resamples: int | None = None,
    seed: int | str | None = None,
) -> Resampled:
    """What the interval of ``statistic`` applied to token-weighted means of ``arrays`` needs, at any level.

    ``arrays`` are per-token values aligned with ``units`` (the document or window of each token: a
    :class:`Units` or a bare label array), all scored on the same tokens. ``statistic`` receives a
    mapping name → mean: floats for the estimate, arrays (one entry per left-out unit) for the
    jackknife, and must work on both (numpy arithmetic does). The interval is analytic
    (:mod:`wkvlab.stats.skewt`): ``n_resamples`` and ``seed`` are accepted from callers written for
    the bootstrap and change nothing; the same data always give the same interval.
    """
    del n_resamples, seed  # analytic: nothing is drawn (see the docstring)
    kind = unit_labels(units)[1]
    counts, sums = per_unit(arrays, units)
    n_units = counts.size
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float(_statistic_on(statistic, {k: s.sum() / counts.sum() for k, s in sums.items()}, ()))
    if n_units < MIN_UNITS:
        return Resampled(point, float("nan"), np.empty(0), n_units, 0, 0, kind, 0.0, METHOD)
    left_out = _leave_one_out(statistic, sums, counts)
    undefined = int((~np.isfinite(left_out)).sum())
    if undefined or not math.isfinite(point):
        return Resampled(point, float("nan"), np.empty(0), n_units, 0, max(undefined, 1), kind, 0.0, METHOD)
    influence = (n_units - 1) * (left_out.mean() - left_out)  # for a mean of equal units: x_u − x̄
    return _from_influence(point, influence, n_units, kind)


def _from_influence(estimate: float, influence: np.ndarray, n_units: int, unit: str) -> Resampled:
    """Analytic draws from per-unit influence values ψ: jackknife SE √(Σψ² / (n(n−1))), skewness of ψ."""
    se = float(math.sqrt(float((influence ** 2).sum()) / (n_units * (n_units - 1))))
    return Resampled(estimate, se, np.empty(0), n_units, 0, 0, unit, skewt.sample_skewness(influence), METHOD, influence)


def paired_interval(
    statistic: Callable[[Mapping[str, np.ndarray | float]], np.ndarray | float],
    arrays: Mapping[str, np.ndarray],
    units,
    *,
    level: float = 0.95,
    n_resamples: int | None = None,
    seed: int | str | None = None,
) -> Interval:
    """The interval of ``statistic`` (see :func:`resample`) at ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return resample(statistic, arrays, units, n_resamples=n_resamples, seed=seed).interval(level)
