"""Paired bootstrap over evaluation units (windows or documents).

Tokens inside one window are strongly correlated (one bad early token shifts all later ones), so a
standard error over tokens is far too optimistic. The unit of resampling is therefore the window:
every config compared was scored on the same windows, and one resample draws the same windows for
all of them (paired), which cancels the window-to-window variation they share.

Every statistic here is a function of token-weighted means of per-token arrays (mean KLD, mean NLL →
PPL = exp(mean NLL), top-1 agreement, and differences or interactions of those). A resample is a
vector of multiplicities per window (multinomial), so the resampled means of any array are one matrix
product: 2000 resamples of a million tokens cost milliseconds, and any function of the means (for
example ``m["wc"] - m["w"] - m["c"]``) is evaluated on all resamples at once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import numpy as np

from wkvlab.errors import DataError

DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    n_units: int
    n_resamples: int

    def contains(self, value: float = 0.0) -> bool:
        return self.low <= value <= self.high

    @property
    def excludes_zero(self) -> bool:
        """True when the difference this interval describes is distinguishable from zero."""
        return not self.contains(0.0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Interval":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def __format__(self, spec: str) -> str:
        spec = spec or ".4g"
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def unit_resampling_weights(n_units: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(n_resamples, n_units) multiplicities: how often each unit is drawn in each resample."""
    if n_units < 1:
        raise DataError("no evaluation windows to resample; evaluate at least one window")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_resamples).astype(np.float64)


def _unit_sums(values: np.ndarray, inverse: np.ndarray, n_units: int) -> np.ndarray:
    return np.bincount(inverse, weights=np.asarray(values, dtype=np.float64), minlength=n_units)


def paired_interval(
    statistic: Callable[[Mapping[str, np.ndarray | float]], np.ndarray | float],
    arrays: Mapping[str, np.ndarray],
    units: np.ndarray,
    *,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Bootstrap interval of ``statistic`` applied to token-weighted means of ``arrays``.

    ``arrays`` are per-token values aligned with ``units`` (the window index of each token), all
    scored on the same tokens. ``statistic`` receives a mapping name → mean: floats for the point
    estimate, arrays of shape (n_resamples,) for the resamples, and must work on both (numpy
    arithmetic does).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    units = np.asarray(units)
    for name, values in arrays.items():
        if np.shape(values) != units.shape:
            raise DataError(f"'{name}' has {np.size(values)} tokens but the units have {units.size}: "
                            "compare only results evaluated on the same tokens")
    labels, inverse = np.unique(units, return_inverse=True)
    n_units = labels.size
    counts = np.bincount(inverse, minlength=n_units).astype(np.float64)
    sums = {name: _unit_sums(values, inverse, n_units) for name, values in arrays.items()}
    point = float(statistic({name: s.sum() / counts.sum() for name, s in sums.items()}))
    weights = unit_resampling_weights(n_units, n_resamples, seed)
    resampled_tokens = weights @ counts
    resampled = np.asarray(statistic({name: (weights @ s) / resampled_tokens for name, s in sums.items()}), dtype=np.float64)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(resampled, [tail, 1.0 - tail])
    # A statistic that is exactly zero on every resample (identical configs) must give [0, 0], not
    # a rounding-noise interval that happens to miss 0.
    return Interval(point, float(min(low, point)), float(max(high, point)), level, int(n_units), n_resamples)
