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
    return resample(lambda m: m["wc"] - m["w"] - m["c"] + m["ref"], cells, units, n_resamples=500)


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
    draws = _interaction_draws(0.02, 16, spread=0.02)
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


def test_tokens_needed_by_the_side_that_must_clear_the_threshold():
    """An asymmetric interval beyond +m: the lower side must clear m. Sized by hand from that side;
    the mean half-width would name fewer tokens than the run has (the bug this guards)."""
    from wkvlab.stats.bootstrap import Interval
    from wkvlab.stats.decision import _needed

    # estimate 0.015, m 0.01: lower side 0.0075 must shrink to 0.005 → (0.0075/0.005)² = 2.25
    iv = Interval(0.015, 0.0075, 0.017, 0.95, 16, 2000)
    assert iv.half_width == pytest.approx(0.00475)  # (0.00475/0.005)² < 1: the old answer, fewer than present
    assert _needed(iv, iv, 0.01, 1000) == (2250, 36)
    # inside ±m, estimate 0.004 in [−0.002, +0.016]: the upper side 0.012 must shrink to 0.006 → 4×;
    # the lower side 0.006 against 0.014 → 0.18×; the upper side decides
    iv = Interval(0.004, -0.002, 0.016, 0.95, 16, 2000)
    assert _needed(iv, iv, 0.01, 1000) == (4000, 64)
    # never fewer than present, even when the widths say 1×
    iv = Interval(0.0, -0.01, 0.01, 0.95, 16, 2000)
    assert _needed(iv, iv, 0.01, 1000) == (1001, 17)
