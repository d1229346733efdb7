"""Paired intervals over evaluation units (windows or documents), analytic, with replicates inside.

Tokens inside one window are strongly correlated (one bad early token shifts all later ones), so a
standard error over tokens is far too optimistic. The unit is therefore the **document** where the
text has them (windows of one document share its difficulty: treating them as independent
under-covers, tests/stats/test_documents.py), and the window where the text is one stream
(:class:`Units` says which, and every interval prints it). Every config compared was scored on the
same units, and every statistic is computed on them jointly (paired), which cancels the unit-to-unit
variation they share.

Every statistic here is a function of token-weighted means of per-token arrays (mean KLD, mean NLL →
PPL = exp(mean NLL), top-1 agreement, and differences or interactions of those). Its standard error
is the jackknife's over units: the statistic with each unit left out is one vectorised evaluation of
the same function on per-unit sums.

**The interval every verdict is read from is analytic** (:mod:`wkvlab.stats.skewt`): Student's t
on that standard error, each side widened by a skewness allowance, so that the error control holds
at the family-adjusted levels where verdicts are made, not only at 95%. Nothing is drawn: no
resample count, no seed, no Monte-Carlo error; the same data give the same bounds (issue #38;
docs/stats.md). The studentized bootstrap this module was named after (2,000 resamples) set a
Holm-adjusted bound by its one or two most extreme resamples and moved verdicts with the seed; it is gone.

**Replicates** (:func:`pool`, :mod:`wkvlab.stats.replicates`): a statistic measured again with
another calibration sample or another float order on the same units pools into one whose standard
error holds the between-replicate variance too, with Satterthwaite degrees of freedom.

Below :data:`MIN_UNITS` units no interval is computed (the estimate is still given) and nothing is
decided. When the statistic is not finite with some unit left out (a bucket only that unit has, a
ratio of zeros) there is no interval either, and ``Interval.dropped`` counts those units.
Decisions (margins, families, verdicts) live in :mod:`wkvlab.stats.decision`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats import skewt
from wkvlab.stats.replicates import Components, components, describe

MIN_UNITS = 8  # fewer resampling units: no interval, no verdict (see the module docstring)
BOOTSTRAP = "studentized bootstrap (jackknife SE within each resample)"  # how records stored before issue #38 name their intervals
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
    """A point estimate with its interval, or none (NaN bounds).

    No interval when there are fewer than :data:`MIN_UNITS` units, or when the statistic is undefined
    with some unit left out (say a ratio whose denominator is 0 there): such an interval decides
    nothing, and its missing bounds must never read as "excludes 0". ``dropped`` counts those units
    (in records stored before issue #38: the bootstrap resamples left out, of ``n_resamples``).
    ``replicates``: the runs pooled into it (:func:`pool`; 0 in records stored before they existed),
    ``df`` its t's degrees of freedom."""

    estimate: float
    low: float
    high: float
    level: float
    n_units: int
    n_resamples: int
    dropped: int = 0
    unit: str = "units"  # what was resampled: documents, windows, blocks (see Units)
    method: str = ""  # skewt.METHOD (analytic); BOOTSTRAP or "" in records stored before issue #38
    mc_error: float = 0.0  # Monte-Carlo standard error of the bounds: 0 for the analytic interval (stored bootstraps had one)
    replicates: int = 1
    df: float = 0.0  # 0: not recorded (an interval without replicates has units − 1)
    # each replicate's own estimate (empty: one run, or a record from before they were kept): with few replicates the
    # between-replicate spread can set the width, and a table shows the estimates that set it
    replicate_estimates: tuple[float, ...] = ()

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
        fields["replicate_estimates"] = tuple(data.get("replicate_estimates") or ())
        return cls(**{k: float("nan") if v is None else v for k, v in fields.items()})

    @property
    def drops(self) -> str:
        """``0 of 2000 resamples dropped`` (bootstrap), ``1 unit leaves it undefined`` (analytic); "" when none."""
        if self.n_resamples:
            return f"{self.dropped} of {self.n_resamples} resamples dropped"
        return f"{self.dropped} {self.unit} left out leave it undefined" if self.dropped else ""

    @property
    def precision(self) -> str:
        """How the bounds were computed, their Monte-Carlo error and the replicates, for every printed interval."""
        if self.method == BOOTSTRAP:
            return f"{BOOTSTRAP}, {self.n_resamples} resamples, Monte-Carlo SE of the bounds {self.mc_error:.2g}"
        if not self.method:
            return "studentized bootstrap (stored before issue #38)"
        return f"{self.method}; {describe(self.replicates, self.df if self.replicates > 1 and self.df else None)}"

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
    """A statistic's estimate, its standard error and what its interval at any level is computed from.

    The interval is the analytic skew-robust t (:mod:`wkvlab.stats.skewt`) from ``se``, ``skew`` (the
    skewness of the units' jackknife influence values) and the degrees of freedom :attr:`df`. With
    replicates (:func:`pool`: builds with other calibration samples, runs in another float order),
    ``se`` holds both variance components and ``df`` is their Satterthwaite df
    (:mod:`wkvlab.stats.replicates`). Intervals at any level come from the same numbers, which is what a
    family adjustment needs: the adjusted interval is the same interval at a stricter level.

    The class keeps its name from the bootstrap it replaced (issue #38): nothing is resampled."""

    estimate: float
    se: float
    n_units: int
    dropped: int = 0  # units whose leaving out leaves the statistic undefined (then: no interval)
    unit: str = "units"
    skew: float = 0.0
    influence: np.ndarray | None = None  # per-unit jackknife influence values: what combine() adds
    replicate_estimates: np.ndarray | None = None  # the estimate of each replicate (None: one run)

    @property
    def replicates(self) -> int:
        return 1 if self.replicate_estimates is None else int(self.replicate_estimates.size)

    @property
    def components(self) -> Components | None:
        return None if self.influence is None else components(self.influence, self.replicate_estimates)

    @property
    def df(self) -> float:
        """Degrees of freedom of the t quantile: units − 1, or the Satterthwaite df with replicates."""
        c = self.components
        return float(self.n_units - 1) if c is None else c.df

    def shifted(self, by: float) -> "Resampled":
        """The statistic + ``by`` (a constant: same SE, skewness and degrees of freedom)."""
        reps = None if self.replicate_estimates is None else self.replicate_estimates + by
        return replace(self, estimate=self.estimate + by, replicate_estimates=reps)

    def combine(self, other: "Resampled", coef: float) -> "Resampled | None":
        """This statistic + ``coef`` × ``other``, both from the same units (their influence values add, and
        so do their replicates' estimates); None when either has no influence values (too few units) or the
        units or replicates differ."""
        a, b = self.influence, other.influence
        if a is None or b is None or a.shape != b.shape or not (self.usable and other.usable):
            return None
        if self.replicates != other.replicates:
            return None
        reps = None if self.replicate_estimates is None else self.replicate_estimates + coef * other.replicate_estimates
        return _from_influence(self.estimate + coef * other.estimate, a + coef * b, self.n_units, self.unit, reps)

    @property
    def usable(self) -> bool:
        return self.n_units >= MIN_UNITS and math.isfinite(self.se) and self.dropped == 0

    def _none(self, level: float) -> Interval:
        return Interval(self.estimate, float("nan"), float("nan"), level, self.n_units, 0, self.dropped, self.unit, METHOD,
                        replicates=self.replicates)

    def interval(self, level: float = 0.95) -> Interval:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if not self.usable:
            return self._none(level)
        low = high = self.estimate  # se 0: every unit and replicate agrees (identical configs, a constant shift)
        if self.se > 0.0:
            low, high = skewt.bounds(self.estimate, self.se, self.skew, self.n_units, level, self.df)
        return Interval(self.estimate, float(low), float(high), level, self.n_units, 0, 0, self.unit, METHOD,
                        replicates=self.replicates, df=round(self.df, 2), replicate_estimates=self._replicate_estimates())

    def _replicate_estimates(self) -> tuple[float, ...]:
        return () if self.replicate_estimates is None else tuple(float(x) for x in self.replicate_estimates)

    def tail_beyond(self, threshold: float, side: str) -> float:
        """The two-sided level α at which the interval's ``side`` bound reaches ``threshold``.

        ``side="low"``: smallest α whose interval has low > threshold; ``"high"``: high < threshold.
        1 when no level does (at most 1), 0 when every level does."""
        if not self.usable:
            return 1.0
        if self.se == 0.0:
            inside = self.estimate > threshold if side == "low" else self.estimate < threshold
            return 0.0 if inside else 1.0
        return skewt.tail_beyond(self.estimate, self.se, self.skew, self.n_units, threshold, side, self.df)


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
) -> Resampled:
    """What the interval of ``statistic`` applied to token-weighted means of ``arrays`` needs, at any level.

    ``arrays`` are per-token values aligned with ``units`` (the document or window of each token: a
    :class:`Units` or a bare label array), all scored on the same tokens. ``statistic`` receives a
    mapping name → mean: floats for the estimate, arrays (one entry per left-out unit) for the
    jackknife, and must work on both (numpy arithmetic does). The interval is analytic
    (:mod:`wkvlab.stats.skewt`): nothing is drawn, so there is no resample count and no seed; the
    same data always give the same interval.
    """
    counts, sums = per_unit(arrays, units)
    return resample_sums(statistic, counts, sums, unit_labels(units)[1])


def resample_sums(
    statistic: Callable[[Mapping[str, np.ndarray | float]], np.ndarray | float],
    counts: np.ndarray,
    sums: Mapping[str, np.ndarray],
    kind: str = "units",
) -> Resampled:
    """:func:`resample` from what it reads of the tokens: each unit's token count and each array's sum over the unit
    (:func:`per_unit`). A measurement kept as per-unit sums (a few numbers per document, where the per-token arrays are
    megabytes) gives the same interval."""
    counts = np.asarray(counts, dtype=np.float64)
    sums = {k: np.asarray(v, dtype=np.float64) for k, v in sums.items()}
    n_units = counts.size
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float(_statistic_on(statistic, {k: s.sum() / counts.sum() for k, s in sums.items()}, ()))
    if n_units < MIN_UNITS:
        return Resampled(point, float("nan"), n_units, 0, kind)
    left_out = _leave_one_out(statistic, sums, counts)
    undefined = int((~np.isfinite(left_out)).sum())
    if undefined or not math.isfinite(point):
        return Resampled(point, float("nan"), n_units, max(undefined, 1), kind)
    influence = (n_units - 1) * (left_out.mean() - left_out)  # for a mean of equal units: x_u − x̄
    return _from_influence(point, influence, n_units, kind)


def _from_influence(estimate: float, influence: np.ndarray, n_units: int, unit: str,
                    replicate_estimates: np.ndarray | None = None) -> Resampled:
    """From per-unit influence values ψ (and the replicates' estimates): SE from the variance components
    (:mod:`wkvlab.stats.replicates`; with one replicate the jackknife SE √(Σψ² / (n(n−1)))), skewness of ψ."""
    se = components(influence, replicate_estimates).se
    return Resampled(estimate, se, n_units, 0, unit, skewt.sample_skewness(influence), influence, replicate_estimates)


def pool(replicates: Sequence[Resampled]) -> Resampled:
    """One statistic measured by several replicates on the same units → its estimate over replicates, with the
    run-to-run variance inside its interval (:mod:`wkvlab.stats.replicates`: the replicates' estimates give
    the between-replicate component, their mean influence values the units' one).

    One replicate is returned as it is. A replicate without an interval (too few units, undefined) leaves
    the pooled statistic without one; replicates scored on different units are an error."""
    if not replicates:
        raise DataError("pool: no replicates")
    if len(replicates) == 1:
        return replicates[0]
    first = replicates[0]
    if any(r.n_units != first.n_units or r.unit != first.unit for r in replicates):
        raise DataError("replicates must be scored on the same units (the same documents or windows) to be pooled")
    estimates = np.array([r.estimate for r in replicates], dtype=np.float64)
    if not all(r.usable and r.influence is not None for r in replicates):
        return Resampled(float(estimates.mean()), float("nan"), first.n_units, max(max(r.dropped for r in replicates), 1)
                         if first.n_units >= MIN_UNITS else 0, first.unit, replicate_estimates=estimates)
    influence = np.mean([r.influence for r in replicates], axis=0)
    return _from_influence(float(estimates.mean()), influence, first.n_units, first.unit, estimates)


def paired_interval(
    statistic: Callable[[Mapping[str, np.ndarray | float]], np.ndarray | float],
    arrays: Mapping[str, np.ndarray],
    units,
    *,
    level: float = 0.95,
) -> Interval:
    """The interval of ``statistic`` (see :func:`resample`) at ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return resample(statistic, arrays, units).interval(level)
