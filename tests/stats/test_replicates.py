"""Run-to-run variance inside the interval (issue #38 item 3): units crossed with replicates, known truth."""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.stats import resample
from wkvlab.stats.bootstrap import pool
from wkvlab.stats.decision import Effect, Margin, decide, units_to_decide
from wkvlab.stats.replicates import components
from wkvlab.stats.skewt import t_quantile
from wkvlab.stats.twostage import two_stage

UNITS = 16


def _replicates(rng, replicates: int, sd_replicate: float, sd_unit: float = 0.03, mu: float = 0.1, tokens: int = 4):
    """Per-token arrays of ``replicates`` runs on the same units: unit effect + replicate effect + cell noise.

    The truth is μ, the value over every build and float order; one run sees μ + its own replicate effect."""
    unit = rng.normal(0.0, sd_unit, UNITS)
    runs = []
    for _ in range(replicates):
        shift = rng.normal(0.0, sd_replicate)
        cell = rng.normal(0.0, sd_unit / 3, UNITS)
        runs.append(np.repeat(mu + unit + shift + cell, tokens))
    return runs, np.repeat(np.arange(UNITS), tokens), mu


def _mean(values, units):
    return resample(lambda m: m["x"], {"x": values}, units)


def test_components_are_the_crossed_designs_two_variances_with_satterthwaite_df():
    psi = np.array([0.3, -0.1, -0.2, 0.0, 0.4, -0.4, 0.1, -0.1])
    theta = np.array([1.0, 1.2, 0.8])
    c = components(psi, theta)
    unit, rep = float((psi ** 2).sum()) / (8 * 7), float(((theta - 1.0) ** 2).sum()) / (3 * 2)
    assert (c.unit_var, c.replicate_var, c.replicates) == (pytest.approx(unit), pytest.approx(rep), 3)
    assert c.se == pytest.approx(math.sqrt(unit + rep))
    assert c.df == pytest.approx((unit + rep) ** 2 / (unit ** 2 / 7 + rep ** 2 / 2))
    assert components(psi).df == 7 and components(psi).replicate_var == 0.0
    assert components(psi, np.array([1.0, 1.0])).df == 7  # replicates that agree leave the units' df


def test_t_quantiles_at_few_degrees_of_freedom_are_exact():
    """Two replicates that disagree leave ~1 df: the Cornish–Fisher expansion is far off there; the table is not."""
    z = NormalDist().inv_cdf(0.975)
    assert t_quantile(z, 1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(z, 2) == pytest.approx(4.3027, abs=1e-3)
    assert t_quantile(NormalDist().inv_cdf(0.995), 3) == pytest.approx(5.8409, abs=1e-3)
    assert t_quantile(NormalDist().inv_cdf(0.995), 1) == pytest.approx(63.657, abs=1e-2)


def test_one_replicate_pools_to_itself_and_different_units_are_refused():
    rng = np.random.default_rng(0)
    runs, units, _ = _replicates(rng, 2, 0.01)
    one = _mean(runs[0], units)
    assert pool([one]) is one and one.replicates == 1
    assert "1 replicate (run-to-run variance not measured)" in one.interval().precision
    with pytest.raises(DataError):
        pool([one, _mean(runs[1][: -4 * 4], units[: -4 * 4])])


def test_the_pooled_interval_covers_the_value_over_replicates_where_one_run_does_not():
    """Known truth μ; each run is shifted by its own replicate effect (calibration sample, float order). The
    interval of one run — what every command printed before — covers μ far less often than 95%; the pooled
    interval of 3 replicates, with the between-replicate variance inside it, covers at least 95%."""
    rng = np.random.default_rng(3)
    trials, one_run, pooled, widths = 300, 0, 0, []
    for _ in range(trials):
        runs, units, mu = _replicates(rng, 3, sd_replicate=0.02)
        single = _mean(runs[0], units).interval(0.95)
        both = pool([_mean(r, units) for r in runs]).interval(0.95)
        one_run += single.low <= mu <= single.high
        pooled += both.low <= mu <= both.high
        widths.append(both.df)
        assert both.replicates == 3 and "3 replicates (between-replicate variance inside the interval" in both.precision
    print(f"\n95% coverage of μ: one run {one_run / trials:.1%}, 3 replicates pooled {pooled / trials:.1%} "
          f"(median Satterthwaite df {np.median(widths):.1f}; {trials} trials)")
    assert one_run / trials < 0.80
    assert pooled / trials >= 0.94


def test_the_pooled_interval_holds_at_a_holm_level():
    """Verdicts are made at Holm levels, not at 95%: at a two-sided 1% the pooled interval still covers ≥ 99%
    − 2 binomial SEs, with the replicate variance as large as the units' standard error."""
    rng = np.random.default_rng(4)
    trials, misses = 600, 0
    for _ in range(trials):
        runs, units, mu = _replicates(rng, 3, sd_replicate=0.0075)
        iv = pool([_mean(r, units) for r in runs]).interval(0.99)
        misses += not iv.low <= mu <= iv.high
    assert misses / trials <= 0.01 + 2 * math.sqrt(0.01 * 0.99 / trials), misses


def test_replicates_that_agree_change_nothing_but_the_count():
    rng = np.random.default_rng(5)
    runs, units, _ = _replicates(rng, 1, 0.0)
    single = _mean(runs[0], units)
    twice = pool([single, _mean(runs[0].copy(), units)])
    a, b = single.interval(0.99), twice.interval(0.99)
    assert (b.low, b.high) == (pytest.approx(a.low), pytest.approx(a.high)) and b.replicates == 2 and b.df == a.df == UNITS - 1


def test_a_margin_from_the_same_replicates_keeps_them_and_a_verdict_names_them():
    """θ ∓ f·R with R estimated on the same units and replicates (stats.decision.sides): the combination keeps the
    replicates' estimates, so the between-replicate variance of the test statistic is the combination's own."""
    rng = np.random.default_rng(6)
    runs, units, _ = _replicates(rng, 3, 0.02)
    theta = pool([_mean(r, units) for r in runs])
    total = pool([_mean(r * 10, units) for r in runs])
    minus = theta.combine(total, -0.1)
    assert minus.replicates == 3
    assert minus.replicate_estimates == pytest.approx(theta.replicate_estimates - 0.1 * total.replicate_estimates)
    (v,) = decide([Effect("x", theta, Margin.relative_to(total.estimate, "the total", 0.1), 64, margin_draws=total)])
    assert "3 replicates (between-replicate variance inside the interval, df" in v.describe()
    assert "no Monte-Carlo error" in v.describe()


def test_units_cannot_decide_what_the_replicates_keep_open():
    """More units shrink only the units' component; an effect inside the replicates' spread stays undecided."""
    c = components(np.full(16, 0.001) * np.where(np.arange(16) % 2, 1, -1), np.array([0.0, 0.05, -0.05]))
    assert units_to_decide(0.02, c.se, 0.0, 16, -0.01, 0.01, 0.025 / 2, spread=c) is None
    alone = components(np.full(16, 0.001) * np.where(np.arange(16) % 2, 1, -1))
    assert units_to_decide(0.02, alone.se, 0.0, 16, -0.01, 0.01, 0.025 / 2, spread=alone) is not None


def test_the_search_findings_crossed_design_is_the_same_rule():
    """stats.twostage (profiles × held-out windows) and pool (replicates × units) are one computation."""
    cells = np.random.default_rng(7).normal(0.1, 0.05, (5, 12))
    crossed = two_stage(cells)
    units = np.arange(12)
    pooled = pool([_mean(row, units) for row in cells])
    assert crossed.estimate == pytest.approx(pooled.estimate) and crossed.se == pytest.approx(pooled.se)
    assert crossed.df == pytest.approx(pooled.df) and crossed.interval().replicates == 5


def test_the_sample_size_advice_reads_the_statistics_the_verdict_reads():
    """θ's two replicates agree; the total its margin is 10% of does not (two builds: 0.10 and 0.30). The verdict
    reads θ ∓ 0.1·total, whose between-replicate spread no number of units shrinks, so the advice is more replicates --
    sizing θ against a fixed m promised a few more documents (the SmolLM2 GPTQ rows: "17 documents would decide it")."""
    rng = np.random.default_rng(8)
    units = np.repeat(np.arange(UNITS), 4)
    unit = np.repeat(rng.normal(0.0, 0.002, UNITS), 4)
    theta = pool([_mean(unit, units), _mean(unit + 0.0005, units)])
    total = pool([_mean(0.10 + unit, units), _mean(0.30 + unit, units)])
    margin = Margin.relative_to(total.estimate, "the total", 0.1)
    (v,) = decide([Effect("x", theta, margin, UNITS * 4, margin_draws=total)])
    assert v.outcome == "undecided" and v.units_needed is None and v.replicates_needed > 2
    assert f"more units alone would not decide it: the replicates disagree; ~{v.replicates_needed} replicates" in v.need()
    (fixed,) = decide([Effect("x", theta, margin, UNITS * 4)])  # the same θ against a known m: decided
    assert fixed.outcome == "within"
    noisy = pool([_mean(unit * 10, units), _mean(unit * 10 + 0.0005, units)])  # units and replicates both too few
    (both,) = decide([Effect("x", noisy, margin, UNITS * 4, margin_draws=total)])
    assert both.replicates_needed is None and both.units_needed is None
    assert both.need() == "neither more units nor more replicates alone decides it at this estimate (it sits near the margin, or needs both)"


def test_tests_holm_leaves_open_are_read_at_the_level_where_it_stopped():
    """Holm rejects the first test and stops at the second: the second and third are both open at α/2 -- the
    third used to be read at its own rank, α/1, so its "adjusted" interval was the raw 95% one."""
    rng = np.random.default_rng(9)
    units = np.repeat(np.arange(UNITS), 4)
    tests = [Effect(name, _mean(np.repeat(rng.normal(mu, sd, UNITS), 4), units), Margin.absolute(0.01), UNITS * 4)
             for name, mu, sd in (("clear", 0.5, 0.01), ("open", 0.012, 0.01), ("more open", 0.011, 0.03))]
    clear, open_, more_open = decide(tests)
    assert clear.outcome == "above" and clear.adjusted.level == pytest.approx(1 - 0.05 / 3)
    assert open_.outcome == more_open.outcome == "undecided"
    assert open_.adjusted.level == more_open.adjusted.level == pytest.approx(1 - 0.05 / 2)
    assert more_open.adjusted.high - more_open.adjusted.low > more_open.raw.high - more_open.raw.low


def test_where_the_replicates_keep_a_test_open_the_advice_is_how_many_would_decide_it():
    """θ's replicates +0.000 and +0.004 on identical units, m ±0.02 known: at two replicates (1 df) the interval at
    95% reaches past ±m; the between-replicate se √(0.002²·2/R) with R − 1 df clears both margins, with the power
    quantile z(0.9) = 1.28 on top of Student's t, first at R = 3 (t₂ = 4.30: 0.018 / 0.00163 = 11.0 ≥ 5.6), which a
    hand computation at R = 2 fails (t₁ = 12.7: 0.018 / 0.002 = 9.0 < 14.0)."""
    units = np.repeat(np.arange(UNITS), 4)
    unit = np.repeat(np.random.default_rng(10).normal(0.0, 1e-4, UNITS), 4)
    theta = pool([_mean(unit, units), _mean(unit + 0.004, units)])
    (v,) = decide([Effect("x", theta, Margin.absolute(0.02), UNITS * 4)])
    assert v.outcome == "undecided" and v.units_needed is None and v.replicates_needed == 3
    assert "~3 replicates (--replicates 3) would decide it with 80% power at this estimate" in v.need()
    # the same replicates agreeing: nothing for more replicates to do, and the verdict is made
    (agree,) = decide([Effect("x", pool([_mean(unit, units), _mean(unit, units)]), Margin.absolute(0.02), UNITS * 4)])
    assert agree.outcome == "within" and agree.replicates_needed is None
