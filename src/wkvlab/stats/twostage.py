"""Two-stage (profile × window) bootstrap for a difference measured by several replicated profiles.

A searched plan depends on the profile it was allocated from, and the profile on the text it was
measured on: "weight-aware beats weight-unaware" is a claim about the *procedure*, so the profile's
own variation has to be in the interval, not only the held-out windows'. With ``values[r, w]`` the
difference (aware − unaware plan, mean KLD) from profile replicate ``r`` (profiled on its own,
disjoint text) on held-out window ``w`` (the same windows for every replicate), one resample draws
replicates with replacement *and* windows with replacement, independently (the "pigeonhole"
bootstrap of a crossed design, Owen 2007, *Ann. Appl. Stat.* 1(2):386–411), and takes the mean of
the drawn cells.

The interval is studentized like :mod:`wkvlab.stats.bootstrap`'s: each resample is standardised by
the crossed design's plug-in standard error on that resample, ``se² = s²(row means)/R +
s²(column means)/W`` (which counts the cell noise twice, so it errs wide: Owen 2007, §3), and the
quantiles of those t values give the bounds. The result is a :class:`~wkvlab.stats.bootstrap.Resampled`,
so the one decision rule (:func:`wkvlab.stats.decision.decide`) decides it like any other effect;
its ``n_units`` are the windows. Fewer than :data:`MIN_PROFILES` replicates or
:data:`~wkvlab.stats.bootstrap.MIN_UNITS` windows: no interval.

Windows are weighted equally (each cell is a per-window mean; the search finding's windows all
score the same number of tokens). tests/stats/test_twostage.py checks coverage on synthetic data
with a known mean: at 5 replicates with skewed (log-normal) profile effects and 16 windows the 95%
interval covered 88% of 300 trials (≈90–95% with normal profile effects or 8 replicates), where
resampling the windows alone — the profiles held fixed — covered 44%.
"""
from __future__ import annotations

import zlib

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats.bootstrap import DEFAULT_RESAMPLES, MIN_UNITS, Resampled

MIN_PROFILES = 5


def _crossed_se(cells: np.ndarray, row_w: np.ndarray, col_w: np.ndarray) -> np.ndarray:
    """Plug-in SE of the drawn-cell mean for each resample (rows of ``row_w`` / ``col_w``: multiplicities)."""
    r, w = cells.shape
    theta = np.einsum("br,rw,bw->b", row_w, cells, col_w) / (r * w)
    row_means = col_w @ cells.T / w  # (B, R): each replicate over the drawn windows
    col_means = row_w @ cells / r  # (B, W): each window over the drawn replicates
    var_r = (row_w * (row_means - theta[:, None]) ** 2).sum(1) / max(r - 1, 1)
    var_w = (col_w * (col_means - theta[:, None]) ** 2).sum(1) / max(w - 1, 1)
    return theta, np.sqrt(var_r / r + var_w / w)


def two_stage(values: np.ndarray, *, n_resamples: int = DEFAULT_RESAMPLES, seed: int | None = None) -> Resampled:
    """Studentized two-stage bootstrap draws of the mean of ``values[replicate, window]``."""
    cells = np.asarray(values, dtype=np.float64)
    if cells.ndim != 2 or cells.size == 0:
        raise DataError(f"two-stage bootstrap needs a (replicates, windows) array, got shape {cells.shape}")
    if not np.isfinite(cells).all():
        raise DataError("two-stage bootstrap: non-finite cells (a plan scored NaN?)")
    r, w = cells.shape
    point = float(cells.mean())
    if r < MIN_PROFILES or w < MIN_UNITS:
        return Resampled(point, float("nan"), np.empty(0), w if r >= MIN_PROFILES else min(w, r), 0, 0)
    _, se = _crossed_se(cells, np.ones((1, r)), np.ones((1, w)))
    crc = zlib.crc32(cells.tobytes())
    rng = np.random.default_rng([crc] if seed is None else [crc, int(seed)])
    row_w = rng.multinomial(r, np.full(r, 1.0 / r), size=n_resamples).astype(np.float64)
    col_w = rng.multinomial(w, np.full(w, 1.0 / w), size=n_resamples).astype(np.float64)
    theta, se_star = _crossed_se(cells, row_w, col_w)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(theta == point, 0.0, (theta - point) / se_star)
    finite = np.isfinite(t)
    return Resampled(point, float(se[0]), np.sort(t[finite]), w, n_resamples, int(n_resamples - finite.sum()))


__all__ = ["two_stage", "MIN_PROFILES"]
