import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats import Interval, paired_interval, unit_resampling_weights


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
    units = np.repeat(np.arange(6), [3, 5, 4, 4, 2, 6])
    arrays = {"a": rng.random(units.size), "b": rng.random(units.size)}
    stat = lambda m: np.exp(m["b"]) - m["a"]  # noqa: E731 - a nonlinear function of means
    iv = paired_interval(stat, arrays, units, n_resamples=300, seed=3)
    naive = _naive(stat, arrays, units, 300, 3)
    lo, hi = np.quantile(naive, [0.025, 0.975])
    assert iv.low == pytest.approx(min(lo, iv.estimate)) and iv.high == pytest.approx(max(hi, iv.estimate))
    assert iv.estimate == pytest.approx(np.exp(arrays["b"].mean()) - arrays["a"].mean())
    assert iv.n_units == 6


def test_identical_configs_give_exactly_zero():
    units = np.repeat(np.arange(4), 10)
    x = np.random.default_rng(0).random(40)
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
