"""The depth design's power (issue #38): the finding's own decision path on simulated documents with a true +15% growth."""
import math

import pytest

from wkvlab.findings.depth_power import calibration, noise_sd, power

DECIDABLE = ("q4_0 raw", "q4_0 adjusted", "int4 raw", "int4 adjusted")


def test_calibration_fits_the_two_committed_records():
    cal = calibration()
    q, i = cal["q4_0"], cal["int4"]
    # per-document SD of the growth at the longest prefix over the penalty at the shortest, from each record's interval:
    # q4_0 at 64 targets [-0.05188, +0.00748] over 0.11687, at 512 targets [-0.01678, +0.01022] over 0.11375 (8 documents)
    t7 = 2.3646
    assert q["sd"][0] == pytest.approx((0.00748 + 0.05188) / 2 / t7 * math.sqrt(8) / 0.11687, rel=2e-3)
    assert q["sd"][1] == pytest.approx((0.01022 + 0.01678) / 2 / t7 * math.sqrt(8) / 0.11375, rel=2e-3)
    assert noise_sd(q, 64) == pytest.approx(q["sd"][0]) and noise_sd(q, 512) == pytest.approx(q["sd"][1])
    assert q["a"] > 0 and i["a"] == 0.0  # q4_0 keeps a per-document floor; int4's fit has none (clamped)
    assert noise_sd(q, 2048) < noise_sd(q, 512) and noise_sd(q, 2048) > math.sqrt(q["a"])


def test_the_design_detects_a_15_percent_growth_with_at_least_80_percent_power():
    # the reference sharpening as measured (-8.3% mean, SD 0.084 per document): the raw growth +15% is the truth
    out = power(documents=32, target=2048, margin="5%", runs=100)
    assert out["sharpening"] == -0.083 and out["reference_sd"] == 0.084
    assert {k: v["power"] >= 0.80 for k, v in out["tests"].items() if k in DECIDABLE} == dict.fromkeys(DECIDABLE, True)
    # q8_0's penalty varies by twice its value between documents: no reachable design decides a 15% change of it
    assert out["tests"]["q8_0 raw"]["power"] < 0.05


def test_the_design_before_issue_38_almost_never_detects_it():
    out = power(documents=8, target=512, margin="10%", runs=100)
    assert all(v["power"] <= 0.05 for v in out["tests"].values())
    # nor, for the raw growth of q4_0, the main design at the rule's 10% margin: a +15% growth is only 5% beyond it
    assert power(documents=32, target=2048, margin="10%", runs=50)["tests"]["q4_0 raw"]["power"] <= 0.2


@pytest.mark.slow
def test_the_power_holds_at_1000_runs():
    out = power(documents=32, target=2048, margin="5%", runs=1000, seed=1)
    assert all(out["tests"][k]["power"] - 2 * out["tests"][k]["se"] >= 0.80 for k in DECIDABLE)
