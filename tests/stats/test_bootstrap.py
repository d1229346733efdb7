import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats import Interval, paired_interval
from wkvlab.stats.bootstrap import MIN_UNITS


def _naive_leave_one_out(statistic, arrays, units):
    """The textbook jackknife: delete one unit's tokens at a time and recompute the token-weighted means."""
    labels = np.unique(units)
    return np.array([statistic({k: v[units != label].mean() for k, v in arrays.items()}) for label in labels])


def test_matches_the_textbook_jackknife_and_the_formula():
    """Estimate, jackknife SE and influence skewness by a naive loop; bounds by the formula in skewt's docstring."""
    from wkvlab.stats.bootstrap import resample
    from wkvlab.stats.skewt import SKEW_ALLOWANCE, sample_skewness, t_quantile

    rng = np.random.default_rng(1)
    units = np.repeat(np.arange(9), [3, 5, 4, 4, 2, 6, 3, 3, 5])
    arrays = {"a": rng.random(units.size), "b": rng.lognormal(size=units.size)}
    stat = lambda m: np.exp(m["b"]) - m["a"]  # noqa: E731 - a nonlinear function of means
    loo = _naive_leave_one_out(stat, arrays, units)
    n = loo.size
    se = np.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum())
    skew = sample_skewness((n - 1) * (loo.mean() - loo))
    draws = resample(stat, arrays, units)
    assert draws.se == pytest.approx(se) and draws.skew == pytest.approx(skew) and draws.n_units == 9
    iv = paired_interval(stat, arrays, units, level=0.95)
    z = 1.959963984540054
    k = (2 * z * z + 1) / (6 * np.sqrt(9))
    point = np.exp(arrays["b"].mean()) - arrays["a"].mean()
    assert iv.estimate == pytest.approx(point)
    assert iv.low == pytest.approx(point - (t_quantile(z, 8) + max(-skew, SKEW_ALLOWANCE) * k) * se)
    assert iv.high == pytest.approx(point + (t_quantile(z, 8) + max(skew, SKEW_ALLOWANCE) * k) * se)
    assert iv.decided and iv.dropped == 0 and iv.n_resamples == 0 and "no Monte-Carlo error" in iv.precision


def test_a_pure_mean_is_student_t_plus_the_allowance():
    """For equal units the SE is s/√n and the skewness is the sample's: t_{15}(0.975) = 2.1314 by the table.
    One far unit makes the sample's own skewness exceed the allowance: the upper side takes it, the lower the allowance."""
    units = np.repeat(np.arange(16), 3)
    x = np.array([1.0, 1.2, 1.4, 1.5, 1.6, 1.8, 2.0, 2.1, 2.2, 2.4, 2.5, 2.6, 2.8, 3.0, 3.1, 40.0])
    iv = paired_interval(lambda m: m["x"], {"x": np.repeat(x, 3)}, units)
    se = x.std(ddof=1) / 4
    z, g = 1.959963984540054, 3.0
    k = (2 * z * z + 1) / (6 * 4)
    d = x - x.mean()
    skew = float(np.sqrt(16 * 15) / 14 * np.mean(d ** 3) / np.mean(d ** 2) ** 1.5)
    assert skew > g
    assert iv.low == pytest.approx(x.mean() - (2.1314 + g * k) * se, abs=2e-4 * se)
    assert iv.high == pytest.approx(x.mean() + (2.1314 + skew * k) * se, abs=2e-4 * se)


def test_the_same_data_give_the_same_interval_whatever_the_seed():
    """Analytic: no draws, so there is no seed or resample count to pass, and repeated calls agree."""
    units = np.repeat(np.arange(10), 4)
    x = np.random.default_rng(0).lognormal(size=units.size)
    same = {paired_interval(lambda m: m["x"], {"x": x}, units) for _ in range(5)}
    assert len(same) == 1
    for gone in ({"seed": 1}, {"n_resamples": 2000}):
        with pytest.raises(TypeError):
            paired_interval(lambda m: m["x"], {"x": x}, units, **gone)


def test_a_unit_without_the_statistic_leaves_no_interval():
    """A bucket only some windows hold: leaving out the only window that has it is undefined, counted, no interval."""
    units = np.repeat(np.arange(12), 5)
    mask = (units < 1).astype(float)  # one window of twelve holds the bucket
    x = np.random.default_rng(2).random(units.size)
    with np.errstate(invalid="ignore"):
        iv = paired_interval(lambda m: m["x"] / m["n"], {"x": x * mask, "n": mask}, units)
    assert iv.dropped == 1 and not iv.decided and "1 of 12 units left out" in f"{iv:.3f}"
    assert Interval.from_dict(iv.to_dict()).decided is False


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
    assert f"{iv:.2f}" == "nan [no interval: undefined with 8 of 8 units left out]"
    assert Interval.from_dict(iv.to_dict()).decided is False


def test_old_results_without_a_dropped_count_still_load():
    data = Interval(0.5, 0.25, 0.75, 0.95, 8, 100).to_dict()
    del data["dropped"]
    assert Interval.from_dict(data).dropped == 0
