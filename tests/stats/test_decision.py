import numpy as np
import pytest

from wkvlab.stats import Margin, Effect, decide, resample
from wkvlab.stats.bootstrap import MIN_UNITS
from wkvlab.stats.decision import DIFFERENCE, Verdict, classify, holm, p_value


def _interaction_draws(delta: float, n_units: int, spread: float = 0.01, seed: int = 0):
    """Four cells on ``n_units`` windows whose interaction is ``delta`` plus window noise of ``spread``."""
    rng = np.random.default_rng(seed)
    units = np.repeat(np.arange(n_units), 32)
    base = np.repeat(rng.lognormal(size=n_units), 32)
    noise = np.repeat(rng.normal(0.0, spread, n_units), 32)
    cells = {"ref": np.zeros(units.size), "w": 0.1 * base, "c": 0.05 * base, "wc": 0.15 * base + delta + noise}
    return resample(lambda m: m["wc"] - m["w"] - m["c"] + m["ref"], cells, units)


def _one(draws, margin=0.01, tokens=1000, **kw):
    return decide([Effect("interaction", draws, Margin(margin, 0.1, "KLD(C)", margin * 10), tokens)], **kw)[0]


def test_three_windows_and_a_real_interaction_are_undecided_never_additive():
    """The issue's case: 3 windows, a true +0.05 interaction. No interval → undecided."""
    v = _one(_interaction_draws(0.05, 3))
    assert v.outcome == "undecided" and v.word == "undecided" and not v.raw.decided
    assert v.units_needed == MIN_UNITS and "≥ 8 units" in v.need() and "additive" not in v.describe()


def test_the_four_outcomes():
    assert _one(_interaction_draws(0.05, 16)).word == "compounds"
    assert _one(_interaction_draws(-0.05, 16)).word == "sub-additive"
    within = _one(_interaction_draws(0.0, 16, spread=1e-4))
    assert within.outcome == "within" and within.word == "additive within ±0.01"
    straddles = _one(_interaction_draws(0.01, 16, spread=0.005))  # centred on the margin: no sample decides
    assert straddles.outcome == "undecided"
    wide = _one(_interaction_draws(0.0, 16, spread=0.03))  # centred on 0 but wider than ±m
    assert wide.outcome == "undecided" and wide.units_needed > 16 and wide.tokens_needed > 1000
    assert f"{wide.units_needed:,} units" in wide.need()


def test_the_margin_not_zero_is_the_bar():
    """An interval above 0 but inside ±m is additive within ±m; one above 0 reaching past +m decides nothing."""
    v = _one(_interaction_draws(0.008, 32, spread=0.002), margin=0.01)
    assert v.raw.excludes_zero and v.outcome == "within"
    v = _one(_interaction_draws(0.009, 32, spread=0.01), margin=0.01)
    assert v.raw.excludes_zero and v.raw.low < 0.01 < v.raw.high and v.outcome == "undecided"


def test_every_verdict_names_its_margin_and_adjustment():
    v = _one(_interaction_draws(0.05, 16), family="SmolLM2 grid")
    text = v.describe()
    assert "margin ±0.01 (10% of KLD(C) 0.1)" in text and "Holm over 1 test (SmolLM2 grid)" in text
    assert Verdict.from_dict(v.to_dict()) == v and v.to_dict()["text"] == text


def test_holm_adjusted_p_values_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.5 → ×4, ×3, ×2, ×1 = 0.04, 0.06, 0.06 (running max), 0.5
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert holm([0.4, 0.4]) == pytest.approx([0.8, 0.8])


def test_family_adjustment_widens_and_can_undo_a_raw_decision():
    draws = [_interaction_draws(d, 12, spread=0.01, seed=s) for s, d in enumerate((0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.019))]
    margin = Margin(0.01, 0.1, "KLD(C)", 0.1)
    alone = [decide([Effect(str(i), d, margin)])[0] for i, d in enumerate(draws)]
    family = decide([Effect(str(i), d, margin) for i, d in enumerate(draws)], family="grid")
    for a, f in zip(alone, family):
        assert a.raw == f.raw and f.family_size == len(draws)
        if f.raw.decided:
            assert f.adjusted.low <= f.raw.low and f.adjusted.high >= f.raw.high
        assert f.decided <= a.decided  # the family never decides what the test alone would not
    assert any(a.decided and not f.decided for a, f in zip(alone, family))


def test_adjusted_interval_decides_exactly_when_holm_does():
    rng = np.random.default_rng(5)
    for trial in range(20):
        draws = [_interaction_draws(rng.normal(0.0, 0.02), 10, spread=0.01, seed=100 * trial + i) for i in range(5)]
        verdicts = decide([Effect(str(i), d, Margin(0.01, 0.1, "KLD(C)", 0.1)) for i, d in enumerate(draws)])
        for v in verdicts:
            assert v.decided == (classify(v.adjusted, 0.01) != "undecided" and v.p_adjusted <= 0.05)
            if v.decided:
                assert v.p_adjusted <= 0.05


def test_p_value_is_where_the_interval_starts_deciding():
    draws = _interaction_draws(0.03, 16, spread=0.02)
    p = p_value(draws, 0.01)
    assert 0.001 < p < 0.05
    assert classify(draws.interval(1 - p * 0.9), 0.01) == "undecided"  # a wider interval: not yet
    assert classify(draws.interval(1 - p * 1.1), 0.01) == "above"


def test_difference_words_and_a_zero_margin_point():
    units = np.repeat(np.arange(8), 4)
    x = np.random.default_rng(0).random(units.size)
    same = resample(lambda m: m["a"] - m["b"], {"a": x, "b": x.copy()}, units)
    v = decide([Effect("ΔKLD", same, Margin.relative_to(0.0, "KLD(a)"), words=DIFFERENCE)])[0]
    assert v.word == "equivalent within ±0" and v.adjusted.low == v.adjusted.high == 0.0


def test_units_to_decide_is_the_smallest_size_that_clears_with_80_percent_power():
    """By its definition: at n the side facing the threshold clears multiplier + z₀.₈ standard errors, at n − 1 it does not."""
    from statistics import NormalDist

    from wkvlab.stats.decision import units_to_decide
    from wkvlab.stats.skewt import multiplier

    z = NormalDist().inv_cdf(0.8)
    n = units_to_decide(0.02, 0.004, 0.0, 16, -0.01, 0.01, 0.025)  # beyond +m: the low side must clear +m
    clears = lambda k: 0.01 / 0.004 * (k / 16) ** 0.5 >= multiplier(0.025, k, 0.0) + z  # noqa: E731
    assert clears(n) and not clears(n - 1) and n > 16
    # inside ±m both sides must clear, each at z of 0.9: more units than one side alone
    both = units_to_decide(0.0, 0.004, 0.0, 16, -0.01, 0.01, 0.025)
    zz = NormalDist().inv_cdf(0.9)
    assert 0.01 / 0.004 * (both / 16) ** 0.5 >= multiplier(0.025, both, 0.0) + zz
    assert 0.01 / 0.004 * ((both - 1) / 16) ** 0.5 < multiplier(0.025, both - 1, 0.0) + zz
    assert units_to_decide(0.01, 0.004, 0.0, 16, -0.01, 0.01, 0.025) is None  # on the margin: nothing decides it


def test_the_suggested_size_decides_in_about_80_percent_of_runs():
    """The size is for "if the effect is what was measured": simulated with the measured mean and spread,
    runs of that size decide in ~80%. The old plug-in ("an interval this wide would decide") decided in
    2–7 of 60 simulated runs at its suggested size (issue #38)."""
    rng = np.random.default_rng(11)
    n0, margin = 16, 0.01
    x = 0.014 + 0.016 * rng.standard_normal(n0)
    draws = resample(lambda m: m["x"], {"x": x}, np.arange(n0))
    v = _one(draws, margin=margin, tokens=n0)
    assert v.outcome == "undecided" and v.units_needed > n0
    n, mean, sd = v.units_needed, draws.estimate, draws.se * np.sqrt(n0)
    decided = sum(_one(resample(lambda m: m["x"], {"x": mean + sd * rng.standard_normal(n)}, np.arange(n)), margin=margin,
                       tokens=n).outcome == "above" for _ in range(300))
    print(f"\nsuggested {n} units (estimate {mean:.4f}, sd {sd:.4f}): decided in {decided}/300")
    assert 0.72 <= decided / 300 <= 0.90
    assert "80% power" in v.need()


def test_the_same_data_give_the_same_verdicts_on_every_run():
    """No Monte-Carlo verdicts (issue #38): resample takes no seed and no resample count, and a family decided
    20 times gives one set of verdicts and bounds."""
    import inspect

    assert set(inspect.signature(resample).parameters) == {"statistic", "arrays", "units"}
    draws_by_seed = []
    for _ in range(20):
        rng = np.random.default_rng(99)  # the data: fixed
        units = np.repeat(np.arange(12), 8)
        tests = []
        for i in range(6):
            base = np.repeat(rng.lognormal(size=12), 8)
            cells = {"ref": np.zeros(units.size), "w": 0.1 * base, "c": 0.05 * base,
                     "wc": 0.15 * base + 0.004 * i + np.repeat(rng.normal(0, 0.01, 12), 8)}
            d = resample(lambda m: m["wc"] - m["w"] - m["c"] + m["ref"], cells, units)
            tests.append(Effect(str(i), d, Margin(0.01, 0.1, "KLD(C)", 0.1), 96))
        draws_by_seed.append([(v.outcome, v.adjusted.low, v.adjusted.high) for v in decide(tests)])
    assert all(d == draws_by_seed[0] for d in draws_by_seed)
