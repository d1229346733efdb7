"""The ship decision (issue #38): each config within the user's tolerance, exceeding it, or undecided."""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.errors import ConfigError
from wkvlab.stats import resample
from wkvlab.stats.tolerance import Tolerance, ship_decision


def _draws(values):
    values = np.asarray(values, dtype=float)
    return resample(lambda m: m["x"], {"x": values}, np.arange(values.size)), values.size


@pytest.mark.parametrize("text,metric,value", [("0.01", "kld", 0.01), ("kld=0.02", "kld", 0.02), ("top1=0.95", "top1", 0.95),
                                               ("top1=95%", "top1", 0.95)])
def test_parse(text, metric, value):
    t = Tolerance.parse(text)
    assert (t.metric, t.value) == (metric, pytest.approx(value))


@pytest.mark.parametrize("text", ["abc", "-0.01", "0", "top1=1.5", "ppl=3", "top1=x"])
def test_bad_tolerances_are_one_line_errors(text):
    with pytest.raises(ConfigError, match="--tolerance"):
        Tolerance.parse(text)


def test_within_exceeds_and_undecided():
    rng = np.random.default_rng(0)
    configs = {"good": _draws(0.002 + 0.0005 * rng.standard_normal(16)),
               "bad": _draws(0.05 + 0.002 * rng.standard_normal(16)),
               "close": _draws(0.0099 + 0.003 * rng.standard_normal(16))}
    v = {x.name: x for x in ship_decision(configs, Tolerance.parse("0.01"), family="test")}
    assert v["good"].outcome == "within tolerance" and v["good"].adjusted.high < 0.01
    assert v["bad"].outcome == "exceeds it" and v["bad"].adjusted.low > 0.01
    assert v["close"].outcome == "undecided" and v["close"].units_needed > 16
    assert all(x.family_size == 3 for x in v.values())
    text = v["close"].describe()
    assert "Holm over 3 configs (test)" in text and "16 units" in text and "80% power" in text


def test_top1_agreement_runs_the_other_way():
    units = np.repeat(np.arange(10), 10)
    loss = np.zeros(100)
    loss[::10] = 1.0  # every unit: 1 of its 10 tokens flipped → 90% agreement, below the 95% asked
    draws = resample(lambda m: m["x"], {"x": loss}, units)
    (v,) = ship_decision({"c": (draws, loss.size)}, Tolerance.parse("top1=0.95"))
    assert v.outcome == "exceeds it" and "top-1 agreement ≥ 95.00%" in v.describe() and "90.000%" in v.describe()


def test_wrong_claims_at_the_tolerance_stay_at_5_percent():
    """Five configs whose mean KLD is exactly τ, right-skewed per-document values: any claim is wrong."""
    rng = np.random.default_rng(7)
    tau, wrong, families = 0.01, 0, 300
    for _ in range(families):
        configs = {}
        for k in range(5):
            x = rng.lognormal(0.0, 0.5, 16)
            configs[str(k)] = _draws(tau * x / np.exp(0.125))
        wrong += any(v.decided for v in ship_decision(configs, Tolerance(metric="kld", value=tau)))
    assert wrong / families <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / families)


@pytest.mark.parametrize("args, message", [
    (["eval", "--kv", "int4", "--tolerance", "abc"], "--tolerance"),
    (["eval", "--kv", "int4", "--tolerance", "top1=1.5"], "between 0 and 1"),
    (["explain", "--weights", "int4", "--kv", "int4", "--margin", "ten"], "--margin"),
    (["findings", "additivity", "--store", "/tmp/wkvlab-margin-check.db", "--margin", "cache:x"], "--margin"),
])
def test_bad_tolerance_and_margin_are_one_line_before_any_model_loads(args, message):
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_configs_holm_leaves_open_share_the_level_where_it_stopped():
    """One config clearly within, two open: both open ones are read at α/2 (Holm stopped at its second step); the last
    used to be read at α/1, its "adjusted" interval the raw 95% one."""
    rng = np.random.default_rng(4)
    configs = {"clear": _draws(0.001 + rng.normal(0, 1e-4, 16)), "open": _draws(0.0099 + rng.normal(0, 0.002, 16)),
               "more open": _draws(0.0101 + rng.normal(0, 0.004, 16))}
    clear, open_, more_open = ship_decision(configs, Tolerance.parse("0.01"))
    assert clear.outcome == "within tolerance" and clear.adjusted.level == pytest.approx(1 - 0.05 / 3)
    assert open_.outcome == more_open.outcome == "undecided"
    assert open_.adjusted.level == more_open.adjusted.level == pytest.approx(1 - 0.05 / 2)
    assert more_open.adjusted.high - more_open.adjusted.low > more_open.raw.high - more_open.raw.low
