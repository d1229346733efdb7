import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats import Interval, paired_interval, unit_resampling_weights
from wkvlab.stats.bootstrap import MIN_UNITS


def _naive(statistic, arrays, units, n_resamples, seed):
    """The textbook loop: draw windows with replacement, recompute token-weighted means, and the
    jackknife SE of each resample by deleting one drawn window at a time."""
    labels = np.unique(units)
    weights = unit_resampling_weights(labels.size, n_resamples, seed)
    rows = [np.flatnonzero(units == label) for label in labels]

    def value(drawn):
        idx = np.concatenate([rows[u] for u in drawn])
        return statistic({k: v[idx].mean() for k, v in arrays.items()})

    def jackknife(drawn):
        loo = np.array([value(drawn[:i] + drawn[i + 1:]) for i in range(len(drawn))])
        return np.sqrt((len(drawn) - 1) / len(drawn) * ((loo - loo.mean()) ** 2).sum())

    theta, se = [], []
    for row in weights:
        drawn = [u for u in range(labels.size) for _ in range(int(row[u]))]
        theta.append(value(drawn))
        se.append(jackknife(drawn))
    everything = list(range(labels.size))
    return value(everything), jackknife(everything), np.array(theta), np.array(se)


def test_matches_naive_resampling_loop():
    from wkvlab.stats.bootstrap import seed_for

    rng = np.random.default_rng(1)
    units = np.repeat(np.arange(9), [3, 5, 4, 4, 2, 6, 3, 3, 5])
    arrays = {"a": rng.random(units.size), "b": rng.random(units.size)}
    stat = lambda m: np.exp(m["b"]) - m["a"]  # noqa: E731 - a nonlinear function of means
    iv = paired_interval(stat, arrays, units, n_resamples=300, seed=3)
    point, se, theta, se_star = _naive(stat, arrays, units, 300, seed_for(arrays, units, 3))
    t = (theta - point) / se_star
    t_low, t_high = np.quantile(t, [0.025, 0.975])
    assert iv.low == pytest.approx(point - t_high * se) and iv.high == pytest.approx(point - t_low * se)
    assert iv.estimate == pytest.approx(np.exp(arrays["b"].mean()) - arrays["a"].mean())
    assert iv.n_units == 9 and iv.decided and iv.dropped == 0


def test_seeds_come_from_the_data_and_reproduce():
    units = np.repeat(np.arange(10), 4)
    x = np.random.default_rng(0).lognormal(size=units.size)
    same = [paired_interval(lambda m: m["x"], {"x": x}, units) for _ in range(2)]
    assert same[0] == same[1]
    other = paired_interval(lambda m: m["x"], {"x": x * 2}, units)  # same shape of data, other draws
    assert (other.low / 2, other.high / 2) != pytest.approx((same[0].low, same[0].high), rel=1e-12)


def test_dropped_resamples_are_counted_and_bounds_are_not_forced():
    """A bucket that only some windows hold: resamples missing it are non-finite, counted, dropped."""
    units = np.repeat(np.arange(12), 5)
    mask = (units < 3).astype(float)  # three windows of twelve hold the bucket: some resamples miss it
    x = np.random.default_rng(2).random(units.size)
    iv = paired_interval(lambda m: m["x"] / m["n"], {"x": x * mask, "n": mask}, units, n_resamples=400)
    assert 0 < iv.dropped < 400 and "resamples dropped" in f"{iv:.3f}"
    assert Interval.from_dict(iv.to_dict()) == iv


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
    assert f"{iv:.2f}" == "nan [no interval: undefined on 2000 of 2000 resamples]"
    assert Interval.from_dict(iv.to_dict()).decided is False


def test_old_results_without_a_dropped_count_still_load():
    data = Interval(0.5, 0.25, 0.75, 0.95, 8, 100).to_dict()
    del data["dropped"]
    assert Interval.from_dict(data).dropped == 0
