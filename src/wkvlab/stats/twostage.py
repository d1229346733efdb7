"""A difference measured by several replicated profiles on the same held-out windows: the crossed design.

A searched plan depends on the profile it was allocated from, and the profile on the text it was
measured on: "weight-aware beats weight-unaware" is a claim about the *procedure*, so the profile's
own variation has to be in the interval, not only the held-out windows'. With ``values[r, w]`` the
difference (aware − unaware plan, mean KLD) from profile replicate ``r`` (profiled on its own,
disjoint text) on held-out window ``w`` (the same windows for every replicate), this is the
replicates × units design of :mod:`wkvlab.stats.replicates`: the estimate is the mean of the cells,
its variance the windows' component (the spread of the window means over replicates) plus the
replicates' (the spread of the replicate means over windows) — the crossed design's plug-in variance,
which counts the cell noise twice and so errs wide (Owen 2007, *Ann. Appl. Stat.* 1(2):386–411, §3) —
and the t quantile takes their Satterthwaite degrees of freedom. Analytic: it replaced a two-stage
("pigeonhole") bootstrap of 2,000 resamples whose bounds moved with the seed (issue #38).

The result is a :class:`~wkvlab.stats.bootstrap.Resampled`, so the one decision rule
(:func:`wkvlab.stats.decision.decide`) decides it like any other effect; its ``n_units`` are the
windows and its ``replicates`` the profiles. Fewer than :data:`MIN_PROFILES` replicates or
:data:`~wkvlab.stats.bootstrap.MIN_UNITS` windows: no interval.

Windows are weighted equally (each cell is a per-window mean; the search finding's windows all
score the same number of tokens). tests/stats/test_twostage.py checks coverage on synthetic data
with a known mean, against resampling the windows alone with the profiles held fixed (44%).
"""
from __future__ import annotations

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats.bootstrap import MIN_UNITS, Resampled, _from_influence

MIN_PROFILES = 5


def two_stage(values: np.ndarray) -> Resampled:
    """The mean of ``values[replicate, window]`` with both variance components in its standard error."""
    cells = np.asarray(values, dtype=np.float64)
    if cells.ndim != 2 or cells.size == 0:
        raise DataError(f"the crossed design needs a (replicates, windows) array, got shape {cells.shape}")
    if not np.isfinite(cells).all():
        raise DataError("the crossed design: non-finite cells (a plan scored NaN?)")
    r, w = cells.shape
    point = float(cells.mean())
    if r < MIN_PROFILES or w < MIN_UNITS:
        return Resampled(point, float("nan"), w if r >= MIN_PROFILES else min(w, r), 0, "windows")
    # a window's influence on the grand mean is its mean over replicates minus the grand mean (the jackknife's, for a mean)
    return _from_influence(point, cells.mean(axis=0) - point, w, "windows", cells.mean(axis=1))


__all__ = ["two_stage", "MIN_PROFILES"]
