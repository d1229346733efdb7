"""The fidelity ratio's interval (:func:`wkvlab.stats.ratio.window_ratio`): a hand-checked case, pairing, coverage."""
from __future__ import annotations

import time

import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats.ratio import window_ratio

RATIO = 0.95  # the true ratio of means of the synthetic data


def test_ratio_of_token_weighted_means_by_hand():
    # 8 windows; window 0 holds 3 tokens of mean 3 (numerator) and 1 (denominator), the others 1 token of 1 and 1:
    # (3·3 + 7·1) / (3·1 + 7·1) = 16/10, not the mean of the window ratios (3 + 7)/8 = 1.25
    num, den, counts = [3.0] + [1.0] * 7, [1.0] * 8, [3] + [1] * 7
    assert window_ratio(num, den, counts).estimate == pytest.approx(1.6)
    assert window_ratio(num, den).estimate == pytest.approx(10 / 8)


def test_an_exact_ratio_on_every_window_is_a_point_interval():
    den = np.array([0.01, 0.5, 0.02, 0.3, 0.07, 0.2, 0.04, 0.9])
    iv = window_ratio(1.1 * den, den)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((1.1, 1.1, 1.1))
    assert iv.decided and iv.n_units == 8


def test_windows_are_resampled_jointly():
    # the denominator varies 50x between windows, the ratio within 1% of 0.95 on each: paired, the interval is
    # narrow; resampling the two sides independently would spread it over the windows' variation
    rng = np.random.default_rng(1)
    den = rng.lognormal(0.0, 1.0, 12)
    iv = window_ratio(RATIO * den * (1 + rng.normal(0, 0.01, 12)), den)
    assert iv.low <= RATIO <= iv.high
    assert iv.high - iv.low < 0.03, iv


def test_fewer_than_8_windows_give_no_interval_and_mismatches_are_refused():
    iv = window_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert iv.estimate == pytest.approx(2.0) and not iv.decided
    with pytest.raises(DataError, match="one value per window"):
        window_ratio([1.0] * 8, [1.0] * 7)


def test_coverage_of_the_95_interval_at_8_windows():
    """Skewed windows (log-normal σ = 0.8 denominators, per-window ratio noise 10%), known ratio of means 0.95."""
    rng, trials, hits, widths = np.random.default_rng(0), 1000, 0, []
    started = time.perf_counter()
    for trial in range(trials):
        den = rng.lognormal(-3.0, 0.8, 8)
        num = RATIO * den * rng.normal(1.0, 0.1, 8)  # E[num | den] = 0.95 den: the population ratio of means is 0.95
        iv = window_ratio(num, den)
        hits += iv.low <= RATIO <= iv.high
        widths.append(iv.high - iv.low)
    coverage = hits / trials
    print(f"\ncoverage of the 95% ratio interval, 8 windows, {trials} trials: {coverage:.1%}, median width {np.median(widths):.3f}, "
          f"{time.perf_counter() - started:.1f} s")
    assert 0.89 <= coverage <= 0.99
    assert np.median(widths) < 0.30  # not covering by being uselessly wide (0.27: the skewness allowance's price)


def test_a_fidelity_row_gives_its_ratio_interval_from_its_windows():
    from wkvlab.engines.compare import FidelityRow

    engine = [0.010, 0.020, 0.015, 0.030, 0.012, 0.018, 0.025, 0.011]
    row = FidelityRow(kv="q4_0", preset="llamacpp:q4_0", sim_spec="q4_0+rot+q=q8_0", engine_kld={"mean": 0.017625},
                      sim_kld={"mean": 0.9 * 0.017625}, engine_top1=0.9, sim_top1=0.9, engine_windows=engine,
                      sim_windows=[0.9 * e for e in engine], window_tokens=[511] * 8)
    iv = row.ratio_interval()
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((0.9, 0.9, 0.9))
    assert row.to_dict()["ratio_interval"]["decided"] is True
    other = row.ratio_interval([e * 1.2 for e in engine])  # another run's windows (the script's `wkvlab eval` side)
    assert other.estimate == pytest.approx(1.2)
