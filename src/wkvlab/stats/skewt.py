"""The interval every verdict is read from: a Student-t interval with a skewness allowance (analytic).

Why not the bootstrap: verdicts are made at Holm levels, 1 − 0.05/k for a family of k tests (α/42 for
the additivity grid, α/176 for the largest), where a bootstrap interval at 8–16 units is set by its few
most extreme resamples. The studentized bootstrap this package used before covered a 95% interval
well enough, but at those levels, on per-unit values as skewed as the committed records' (sample
skewness of per-window interactions −1.5 … +1.4 at 8 windows, docs/runs/findings-attention-default.json),
its error in the tail facing the skew was 5–30× the nominal rate, and its bounds moved with the seed
(tests/stats/test_error_control.py measures both). Student's t alone has the same problem: a skewed
mean and its standard deviation are correlated, so the t statistic has a long tail on the side
opposite the skew; a sample that happens to miss the rare large values looks tight and far from the
truth.

The interval (Johnson 1978, *JASA* 73:536–544; Hall 1992, *Ann. Statist.* 20:675–694, for the
skewness term of the studentized mean's Edgeworth expansion, P(T ≤ x) = Φ(x) + γ(2x² + 1)φ(x)/(6√n)):

    low  = θ̂ − (t_{n−1}(1 − q) + max(−γ̂, G)·k) · se,      k = (2 z²_{1−q} + 1) / (6 √n)
    high = θ̂ + (t_{n−1}(1 − q) + max(+γ̂, G)·k) · se,      q = (1 − level) / 2

with se the jackknife standard error over units and γ̂ the sample skewness of the units' jackknife
influence values (for a mean: of the per-unit values). The one-term Edgeworth correction is too small
in the far tails Holm needs, and γ̂ from 8 units is biased towards 0; so each side is widened by at
least the declared **skewness allowance** :data:`SKEW_ALLOWANCE` = 3, whichever sign the sample shows.
G = 3 is the smallest allowance that kept the per-tail error at α/84 below its nominal rate (≤ 1×) for
per-unit populations up to skewness 1.75 (log-normal σ = 0.5) at 8, 16 and 32 units, and below 1.8×
for skewness 2.3 (σ = 0.6), heavy tails (t₃) ≤ 0.02×, normal ≤ 0.03× (200,000 simulated samples
each; tests/stats/test_error_control.py and benchmarks/stats_error_control.py measure the
family-wise rate on the project's own decision path). The price: at 16 units the interval at α/42 is
about 1.5× Student's; at 32, 1.4×. Per-unit values more skewed than that (log-normal σ = 1, skewness
6.2) are not covered at 8 units: the docs say so (docs/stats.md).

It is analytic: no resampling, no seed, no Monte-Carlo error. Two runs on the same per-unit values
give the same bounds and the same verdicts. Student's t quantile is its Cornish–Fisher expansion in the
normal quantile (:func:`t_quantile`), so the core needs no SciPy.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

SKEW_ALLOWANCE = 3.0
METHOD = f"skew-robust t (Student t + skewness allowance {SKEW_ALLOWANCE:g}), analytic: no Monte-Carlo error"
_NORMAL = NormalDist()


CORNISH_FISHER_DF = 7  # from here on the expansion is within 0.3% (tail 10⁻⁴); below, the exact quantile


def t_quantile(z: float, df: float) -> float:
    """Student's t quantile at the normal quantile ``z`` (same tail), ``df`` ≥ 1 (not necessarily whole:
    a Satterthwaite df, :mod:`wkvlab.stats.replicates`).

    From :data:`CORNISH_FISHER_DF` df on, its Cornish–Fisher expansion in 1/df (A&S 26.7.5, four terms):
    within 0.3% of the exact quantile at 7 df down to a tail of 10⁻⁴ and 0.8% at 10⁻⁵, closer with more
    df (tests/stats/test_bootstrap.py). Closed form, so the level at which a bound reaches a threshold is
    found in microseconds. Below 7 df (an interval whose between-replicate variance has few replicates)
    the expansion is far off (at 1 df it is 40% short in the tail Holm needs), so the quantile is found
    exactly from the t distribution's tail, P(T > t) = I_{df/(df+t²)}(df/2, 1/2) / 2 (A&S 26.7.1)."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    if df < CORNISH_FISHER_DF:
        return _exact_t_quantile(z, df)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t ≥ 0."""
    return 0.5 * _beta_regularized(df / 2.0, 0.5, df / (df + t * t))


def _exact_t_quantile(z: float, df: float) -> float:
    """The t quantile whose upper tail is the normal tail at ``z``: bisection on log t (tails reach 10⁵ at 1 df)."""
    tail = _NORMAL.cdf(-abs(z))
    if tail >= 0.5:
        return 0.0
    lo, hi = math.log(1e-12), math.log(1e12)
    for _ in range(120):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_tail(math.exp(mid), df) > tail else (lo, mid)
    return math.copysign(math.exp((lo + hi) / 2), z)


def sample_skewness(values: np.ndarray) -> float:
    """Adjusted Fisher–Pearson skewness G1 (0 for fewer than 3 values or no spread)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 3:
        return 0.0
    d = x - x.mean()
    m2, m3 = float(np.mean(d ** 2)), float(np.mean(d ** 3))
    if m2 <= 0.0:
        return 0.0
    return math.sqrt(n * (n - 1)) / (n - 2) * m3 / m2 ** 1.5


def _multiplier_at(z: float, n_units: int, allowance: float, df: float | None = None) -> float:
    return t_quantile(z, n_units - 1 if df is None else df) + allowance * (2 * z * z + 1) / (6 * math.sqrt(n_units))


def multiplier(tail: float, n_units: int, skew: float, df: float | None = None) -> float:
    """The se multiplier of one side at one-sided tail ``tail``: t quantile plus the skewness term.

    ``skew`` is the skewness the side must allow for (positive widens it); never less than the allowance.
    ``df``: the t's degrees of freedom (default ``n_units − 1``; with replicates, their Satterthwaite df)."""
    return _multiplier_at(-_NORMAL.inv_cdf(tail), n_units, max(skew, SKEW_ALLOWANCE), df)


def bounds(estimate: float, se: float, skew: float, n_units: int, level: float, df: float | None = None) -> tuple[float, float]:
    """(low, high) at two-sided ``level`` (see the module docstring)."""
    tail = (1.0 - level) / 2.0
    return (estimate - multiplier(tail, n_units, -skew, df) * se, estimate + multiplier(tail, n_units, skew, df) * se)


def tail_beyond(estimate: float, se: float, skew: float, n_units: int, threshold: float, side: str,
                df: float | None = None) -> float:
    """The smallest two-sided α whose ``side`` bound is beyond ``threshold`` (low > thr, high < thr); 1: none.

    The multiplier grows monotonically with the normal quantile z of the tail, so z is found by
    bisection where the multiplier equals the standardised distance, and α = 2·Φ(−z)."""
    distance = (estimate - threshold) / se if side == "low" else (threshold - estimate) / se
    allowance = max(-skew if side == "low" else skew, SKEW_ALLOWANCE)
    if not distance > _multiplier_at(0.0, n_units, allowance, df):
        return 1.0
    lo, hi = 0.0, 1.0
    while _multiplier_at(hi, n_units, allowance, df) < distance:
        lo, hi = hi, 2 * hi
        if hi > 64:  # α = 2Φ(−64): nothing smaller is representable
            return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _multiplier_at(mid, n_units, allowance, df) < distance else (lo, mid)
    return min(1.0, 2.0 * _NORMAL.cdf(-hi))
