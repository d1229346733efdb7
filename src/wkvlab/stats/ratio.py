"""The ratio of two means measured on the same windows, with a paired interval.

Used for engine fidelity (``wkvlab eval`` KLD / the engine's own KLD, docs/engines.md): both sides
are scored on identical windows, so the windows are paired, and
the interval is :mod:`wkvlab.stats.bootstrap`'s analytic one (no resampling, no seed), of the statistic
``mean(numerator) / mean(denominator)`` — the ratio of means, not the mean of per-window ratios
(a window with a tiny denominator would dominate that).

Only the per-window sums enter an interval of token-weighted means over windows, and the token counts
cancel in a ratio of two means over the same tokens: the ratio is ``Σ_w n_w a_w / Σ_w n_w b_w``
for per-window means ``a_w``, ``b_w`` and ``n_w`` tokens each. So each window is passed on as one
unit holding its token sums.
"""
from __future__ import annotations

import numpy as np

from wkvlab.errors import DataError
from wkvlab.stats.bootstrap import Interval, paired_interval


def window_ratio(numerator, denominator, counts=None, *, level: float = 0.95) -> Interval:
    """Ratio of the token-weighted means of two per-window arrays, windows paired.

    ``numerator`` and ``denominator``: the mean of each window on each side (same windows, same
    order); ``counts``: tokens per window (equal when omitted). Fewer than
    :data:`~wkvlab.stats.bootstrap.MIN_UNITS` windows give the estimate without an interval."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    n = np.ones_like(num) if counts is None else np.asarray(counts, dtype=np.float64)
    if num.ndim != 1 or num.shape != den.shape or num.shape != n.shape:
        raise DataError(f"window_ratio needs one value per window on both sides: {num.shape}, {den.shape}, counts {n.shape}")
    if num.size == 0:
        raise DataError("window_ratio: no windows")
    sums = {"num": num * n, "den": den * n}
    return paired_interval(lambda m: m["num"] / m["den"], sums, np.arange(num.size), level=level)


__all__ = ["window_ratio"]
