"""Predictor arithmetic on a hand-made profile, the correction fit, Spearman, Pareto."""
import math

import pytest

from wkvlab.search.pareto import Point, pareto_front
from wkvlab.search.predict import fit_scale, predictor_from_profile, spearman
from wkvlab.search.profile import SensitivityProfile


def hand_profile(**overrides) -> SensitivityProfile:
    data = dict(
        model="m", data="d", weights="int4-g128", weights_spec={}, ctx=16, tokens=15, layers=3, kv_heads=1, head_dim=32,
        base={"kld": 0.10, "se": 0.0, "tokens": 15},
        k={"int4": [0.30, 0.12, 0.11]}, v={"int4": [0.15, 0.10, 0.09]},  # raw KLDs; deltas are these minus 0.10
        uniform={"int4/int4": 0.10 + 2 * (0.20 + 0.02 + 0.01 + 0.05 + 0.0 + 0.0)},  # twice the additive sum
        weight_layers=[0.02, 0.03, 0.05],
    )
    data.update(overrides)
    return SensitivityProfile(**data)


def test_additive_terms_and_fitted_corrections():
    prof = hand_profile()
    raw = predictor_from_profile(prof, correct=False)
    plan = (("int4", "int4"), ("fp16", "fp16"), ("int4", "fp16"))
    # layer 0: 0.20 + 0.05; layer 1: nothing; layer 2: 0.01 + 0 (V at fp16). The V delta of -0.01 at layer 2 is clipped.
    assert raw.additive(plan) == pytest.approx(0.26)
    assert raw.predict(plan) == pytest.approx(0.36)
    fitted = predictor_from_profile(prof)
    assert fitted.alpha_kv == pytest.approx(2.0)
    assert fitted.alpha_w == pytest.approx(0.10 / 0.10)
    assert fitted.predict(plan, keep_16bit=(2,)) == pytest.approx(0.10 + 2 * 0.26 - 0.05)


def test_fit_scale_least_squares_through_origin():
    assert fit_scale([1.0, 2.0], [2.0, 4.0]) == pytest.approx(2.0)
    assert fit_scale([1.0, 1.0], [1.0, 3.0]) == pytest.approx(2.0)
    assert fit_scale([], []) == 1.0


def test_spearman_hand_values():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 2], [1, 2]))


def test_pareto_front_hand_data():
    pts = [Point("a", 10, 0.5), Point("b", 20, 0.2), Point("c", 15, 0.6), Point("d", 30, 0.2), Point("e", 5, 0.9)]
    assert [p.name for p in pareto_front(pts)] == ["e", "a", "b"]


def test_profile_json_round_trip(tmp_path):
    prof = hand_profile(sinks=[{"layer": 0, "attention_to_first": 0.5}], notes=["n"])
    path = tmp_path / "p.json"
    prof.save(path)
    assert SensitivityProfile.load(path) == prof


def test_profile_rejects_unknown_fields_and_missing_formats(tmp_path):
    from wkvlab.errors import ConfigError

    with pytest.raises(ConfigError):
        SensitivityProfile.from_dict({**hand_profile().to_dict(), "extra": 1})
    with pytest.raises(ConfigError, match="no K measurements for int2"):
        hand_profile().k_delta("int2")


def test_verdict_pairs_the_plan_with_each_rival_by_window():
    import numpy as np

    from wkvlab.search.api import Row, _decide, _verdict_text
    from wkvlab.search.measure import Score

    rng = np.random.default_rng(0)
    windows = np.repeat(np.arange(8), 20)
    shared = np.repeat(rng.random(8), 20)  # windows differ a lot; pairing cancels it

    def row(name, kind, level, budget=100.0):
        per_token = level + shared + rng.normal(0, 0.001, windows.size)
        return Row(name, kind, "", 0.0, 0, 0.0, True, None, float(per_token.mean()), 0.01, budget=budget,
                   score=Score(float(per_token.mean()), 0.01, windows.size, per_token, windows))

    def verdict(rows, budget=100.0):
        points, _ = _decide(rows, [budget], 10.0, {}, {budget: []}, 0.10)
        return _verdict_text(points[0])

    plan = row("plan", "plan", 0.5)
    text = verdict([plan, row("uniform K4V4", "uniform", 0.9), row("weight-unaware plan", "unaware", 0.3)])
    assert "minus uniform K4V4" in text and "→ better (lower KLD)" in text  # plan beats uniform, decided
    assert "minus weight-unaware plan" in text and "→ worse (higher KLD)" in text  # and the unaware plan beats the plan
    assert text.count("Holm over 2 tests (plan vs its rivals at equal memory: 2 differences)") == 2 and "10% of its KLD" in text
    close = verdict([plan, row("uniform K8V8", "uniform", 0.52)])  # 2% apart: equivalent within ±10% of its KLD
    assert "→ equivalent within ±" in close
    mixes = [row(f"random mix {i}", "random", level) for i, level in enumerate((0.8, 1.0, 1.2))]
    both = verdict([plan, *mixes])
    assert "minus mean of 3 random mixes (" in both and "→ better (lower KLD)" in both  # the mixes are one rival: their mean
    few = Row("plan", "plan", "", 0.0, 0, 0.0, True, None, 0.5, 0.01, budget=100.0,
              score=Score(0.5, 0.01, 4, np.full(4, 0.5), np.arange(4)))
    other = Row("uniform K8V8", "uniform", "", 0.0, 0, 0.0, True, None, 0.4, 0.01, budget=100.0,
                score=Score(0.4, 0.01, 4, np.full(4, 0.4), np.arange(4)))
    text = verdict([few, other])
    assert "no interval: 4 < 8 units" in text and "→ undecided" in text  # four windows decide nothing
