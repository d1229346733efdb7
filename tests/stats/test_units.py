"""Block units for long windows, the decorrelation lag, and bucket means as bootstrap statistics."""
import numpy as np
import pytest

from wkvlab.stats import paired_interval
from wkvlab.stats.units import block_units, bucket_arrays, bucket_mean, decorrelation_lag


def test_block_units_never_mix_windows_or_blocks():
    window = np.repeat([0, 1], 10)
    position = np.tile(np.arange(10), 2)
    units = block_units(window, position, block=4)
    assert list(units[:10]) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert list(units[10:]) == [3, 3, 3, 3, 4, 4, 4, 4, 5, 5]


def test_decorrelation_lag_of_an_ar1_series():
    rng = np.random.default_rng(0)
    phi, n = 0.9, 200_000
    x = np.empty(n)
    x[0] = 0.0
    noise = rng.normal(size=n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    # autocorrelation phi^lag falls below 0.05 at lag ceil(log 0.05 / log 0.9) = 29
    assert decorrelation_lag(x, np.zeros(n, dtype=int)) in (28, 29, 30)
    assert decorrelation_lag(rng.normal(size=10_000), np.zeros(10_000, dtype=int)) == 1
    assert decorrelation_lag(np.ones(5), np.zeros(5, dtype=int)) == 1  # constant: nothing to correlate


def test_bucket_mean_statistic_by_hand():
    position = np.array([0, 1, 2, 3, 4, 5])
    values = np.array([1.0, 3.0, 10.0, 20.0, 30.0, 40.0])
    data = bucket_arrays({"v": values}, position, [(0, 2), (2, 6)])
    means = {name: a.mean() for name, a in data.items()}
    assert bucket_mean("v", 0)(means) == pytest.approx(2.0, abs=1e-12)
    assert bucket_mean("v", 2)(means) == pytest.approx(25.0, abs=1e-12)
    interval = paired_interval(lambda m: bucket_mean("v", 2)(m) - bucket_mean("v", 0)(m), data, np.arange(6))
    assert interval.estimate == pytest.approx(23.0, abs=1e-12)
