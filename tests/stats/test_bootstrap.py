import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats import Interval, paired_interval, unit_resampling_weights
from wkvlab.stats.bootstrap import MIN_UNITS, _student_quantile, expanded_tail


def _naive(statistic, arrays, units, n_resamples, seed):
    """The textbook loop: draw windows with replacement, recompute token-weighted means."""
    labels = np.unique(units)
    weights = unit_resampling_weights(labels.size, n_resamples, seed)
    out = []
    for row in weights:
        idx = np.concatenate([np.flatnonzero(units == labels[u]).repeat(1) for u in range(labels.size) for _ in range(int(row[u]))])
        out.append(statistic({k: v[idx].mean() for k, v in arrays.items()}))
    return np.array(out)


def test_matches_naive_resampling_loop():
    rng = np.random.default_rng(1)
    units = np.repeat(np.arange(9), [3, 5, 4, 4, 2, 6, 3, 3, 5])
    arrays = {"a": rng.random(units.size), "b": rng.random(units.size)}
    stat = lambda m: np.exp(m["b"]) - m["a"]  # noqa: E731 - a nonlinear function of means
    iv = paired_interval(stat, arrays, units, n_resamples=300, seed=3)
    naive = _naive(stat, arrays, units, 300, 3)
    tail = expanded_tail(0.95, 9)
    lo, hi = np.quantile(naive, [tail, 1 - tail])
    assert iv.low == pytest.approx(min(lo, iv.estimate)) and iv.high == pytest.approx(max(hi, iv.estimate))
    assert iv.estimate == pytest.approx(np.exp(arrays["b"].mean()) - arrays["a"].mean())
    assert iv.n_units == 9 and iv.decided


def test_identical_configs_give_exactly_zero():
    units = np.repeat(np.arange(8), 10)
    x = np.random.default_rng(0).random(80)
    iv = paired_interval(lambda m: m["a"] - m["b"], {"a": x, "b": x.copy()}, units)
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0) and iv.contains(0.0) and not iv.excludes_zero


def test_pairing_removes_shared_window_variation():
    # Windows differ a lot; the two configs differ by a constant 0.01 everywhere: paired → tight, excludes 0.
    units = np.repeat(np.arange(20), 50)
    base = np.repeat(np.random.default_rng(2).random(20) * 10, 50)
    iv = paired_interval(lambda m: m["b"] - m["a"], {"a": base, "b": base + 0.01}, units)
    assert iv.estimate == pytest.approx(0.01) and iv.high - iv.low < 1e-9 and iv.excludes_zero


def test_interval_json_round_trip_and_format():
    iv = Interval(0.5, 0.25, 0.75, 0.95, 8, 100)
    assert Interval.from_dict(iv.to_dict()) == iv
    assert f"{iv:.2f}" == "0.50 [0.25, 0.75]"


def test_misaligned_arrays_are_refused():
    with pytest.raises(DataError, match="same tokens"):
        paired_interval(lambda m: m["a"], {"a": np.zeros(3)}, np.zeros(4))


def test_too_few_units_give_no_interval_and_no_verdict():
    """One window (or a handful) cannot resample: the estimate stays, the interval and the verdict go."""
    x = np.random.default_rng(0).random(50) + 1.0  # clearly above 0, but from one window
    for n_units in (1, MIN_UNITS - 1):
        units = np.arange(50) % n_units
        iv = paired_interval(lambda m: m["x"], {"x": x}, units)
        assert iv.estimate == pytest.approx(x.mean()) and not iv.decided
        assert np.isnan(iv.low) and np.isnan(iv.high) and not iv.excludes_zero and iv.contains(0.0)
        assert f"{iv:.2f}" == f"{x.mean():.2f} [no interval: {n_units} < {MIN_UNITS} units]"
        assert Interval.from_dict(iv.to_dict()).decided is False
    units = np.repeat(np.arange(MIN_UNITS), 10)
    assert paired_interval(lambda m: m["x"], {"x": np.random.default_rng(1).random(units.size) + 1.0}, units).excludes_zero


def test_a_statistic_undefined_on_every_resample_decides_nothing():
    """Enough windows, but a ratio of zeros: NaN bounds must not read as an interval that excludes 0."""
    units = np.repeat(np.arange(MIN_UNITS), 5)
    zeros = np.zeros(units.size)
    with np.errstate(invalid="ignore"):
        iv = paired_interval(lambda m: m["a"] / m["b"], {"a": zeros, "b": zeros}, units)
    assert iv.n_units == MIN_UNITS and not iv.decided and not iv.excludes_zero and iv.contains(0.0)
    assert f"{iv:.2f}" == "nan [no interval: undefined on every resample]"
    assert Interval.from_dict(iv.to_dict()).decided is False


def test_student_quantile_matches_the_table():
    # t_{0.975, df}: 2.3646 (7), 2.2281 (10), 2.0423 (30); t_{0.95, 7} = 1.8946
    for p, df, expected in ((0.975, 7, 2.3646), (0.975, 10, 2.2281), (0.975, 30, 2.0423), (0.95, 7, 1.8946)):
        assert _student_quantile(p, df) == pytest.approx(expected, abs=2e-3)


def test_expanded_interval_covers_near_the_level_at_the_minimum():
    """The reason for MIN_UNITS and the expansion: 95% intervals cover ~95% from 8 units on."""
    rng = np.random.default_rng(0)
    trials, hits = 300, 0
    for trial in range(trials):
        iv = paired_interval(lambda m: m["x"], {"x": rng.normal(0.0, 1.0, MIN_UNITS)}, np.arange(MIN_UNITS), n_resamples=500, seed=trial)
        hits += iv.contains(0.0)
    assert 0.89 <= hits / trials <= 0.99
