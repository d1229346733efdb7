import json

import numpy as np
import pytest
import torch

from tests.explain.results_a import result, window_noise
from tests.explain.tiny_loaded import VOCAB
from wkvlab.data.windows import make_windows
from wkvlab.errors import DataError
from wkvlab.eval.runner import run_grid
from wkvlab.explain.factorial import Factorial, cells_from_grid, factorial, factorial_specs
from wkvlab.kv.spec import KVSpec
from wkvlab.weights.spec import WeightSpec


def _cells(**kw):
    n = window_noise()
    return {
        "ref": result(0.0, nll=1.0, weights="none", kv="fp16", **kw),
        "w": result(0.1 + n, nll=1.1, weights="int4-g128", kv="fp16", **kw),
        "c": result(0.05 + n, nll=1.2, weights="none", kv="int4", **kw),
        "wc": result(0.17 + 2 * n, nll=1.4, weights="int4-g128", kv="int4", **kw),
    }


def test_hand_computed_kld_and_ppl_effects():
    f = factorial(_cells())
    n = window_noise().mean()
    assert f.kld.w.estimate == pytest.approx(0.1 + n) and f.kld.c.estimate == pytest.approx(0.05 + n)
    assert f.kld.wc.estimate == pytest.approx(0.17 + 2 * n)
    # the window noise cancels in the interaction on every resample: a point interval at 0.02
    assert f.kld.interaction.estimate == pytest.approx(0.02)
    assert f.kld.interaction.low == pytest.approx(0.02) and f.kld.interaction.high == pytest.approx(0.02)
    assert f.kld.interaction.excludes_zero
    assert f.kld.ratio.estimate == pytest.approx((0.17 + 2 * n) / (0.15 + 2 * n))
    e = np.exp
    assert f.ppl.reference == pytest.approx(e(1.0))
    assert f.ppl.w.estimate == pytest.approx(e(1.1) - e(1.0))
    # the PPL interaction is on log PPL (mean NLL): e^a(e^b − 1)(e^c − 1) on PPL itself is the scale's (issue #38)
    assert f.ppl.interaction.estimate == pytest.approx(1.4 - 1.1 - 1.2 + 1.0)
    assert (f.windows, f.tokens, f.weights, f.kv, f.identity_kld_max) == (8, 256, "int4-g128", "int4", 0.0)


def test_top1_loss_effects():
    idx = np.arange(256)
    cells = _cells()
    cells["w"] = result(0.1, agree=idx % 10 != 0, weights="int4-g128", kv="fp16")  # loses 26 of 256
    cells["c"] = result(0.1, agree=idx % 20 != 0)  # loses 13
    cells["wc"] = result(0.3, agree=idx % 5 != 0)  # loses 52
    f = factorial(cells)
    assert f.top1.w.estimate == pytest.approx(26 / 256) and f.top1.c.estimate == pytest.approx(13 / 256)
    assert f.top1.interaction.estimate == pytest.approx((52 - 26 - 13) / 256)


def test_round_trips_through_json():
    f = factorial(_cells())
    text = json.dumps(f.to_dict())  # NaN (the undefined ratio of zero effects) != NaN, so compare the JSON
    assert json.dumps(Factorial.from_dict(json.loads(text)).to_dict()) == text


def test_refuses_missing_cells_and_other_tokens():
    cells = _cells()
    with pytest.raises(DataError, match="missing: wc"):
        factorial({k: v for k, v in cells.items() if k != "wc"})
    cells["c"] = result(0.05, nll_ref=3.0)
    with pytest.raises(DataError, match="same tokens"):
        factorial(cells)


def _tiny_windows(ctx=32, n=8):
    ids = torch.randint(0, VOCAB, (n * ctx,), generator=torch.Generator().manual_seed(0))
    return make_windows(ids, ctx=ctx, n_tokens=n * ctx, bos_id=None)


def test_identity_config_interval_contains_zero():
    """The issue's done-when: W = none, C = fp16 through the real runner gives exactly zero effects."""
    from tests.explain.tiny_loaded import tiny_loaded

    model = tiny_loaded().model
    grid = run_grid(model, _tiny_windows(), *factorial_specs(WeightSpec.parse("none"), KVSpec.parse("fp16")), model_name="tiny", data_name="random")
    f = factorial(cells_from_grid(grid))
    for metric in ("kld", "ppl", "top1"):
        e = f.metric(metric)
        for iv in (e.w, e.c, e.wc, e.interaction):
            assert iv.contains(0.0) and iv.estimate == 0.0
        assert e.additive if metric != "top1" else e.verdict is None  # top-1: never decided


def test_quantized_cells_on_a_tiny_model():
    from tests.explain.tiny_loaded import tiny_loaded

    model = tiny_loaded().model
    grid = run_grid(model, _tiny_windows(), *factorial_specs(WeightSpec.parse("int4-g32"), KVSpec.parse("int2")), model_name="tiny", data_name="random")
    cells = cells_from_grid(grid)
    assert (cells["w"].weights, cells["w"].kv, cells["c"].weights, cells["c"].kv) == ("int4-g32", "fp16", "none", "int2")
    f = factorial(cells)
    assert f.identity_kld_max == 0.0  # the hook is exact with the identity spec
    assert f.kld.w.estimate > 0 and f.kld.c.estimate > 0 and f.kld.wc.estimate > 0
    for e in (f.kld.w, f.kld.c, f.kld.wc, f.kld.interaction):
        assert e.low <= e.estimate <= e.high
    assert f.kld.interaction.estimate == pytest.approx(f.kld.wc.estimate - f.kld.w.estimate - f.kld.c.estimate)


def test_a_single_window_factorial_refuses_its_verdict():
    """The case that printed "[x, x]" and "Not additive": one window cannot be resampled."""
    n = window_noise(3, windows=1)
    cells = {"ref": result(0.0, windows=1), "w": result(0.1 + n, nll=1.1, windows=1, weights="int4-g128", kv="fp16"),
             "c": result(0.05 + n, nll=1.2, windows=1), "wc": result(0.2 + 2 * n, nll=1.4, windows=1, weights="int4-g128", kv="int4")}
    f = factorial(cells)
    assert f.kld.interaction.estimate == pytest.approx(0.05) and not f.kld.interaction.decided
    assert not f.kld.additive and f.kld.word == "undecided"  # neither compounding nor additive: nothing is decided


def test_three_windows_and_a_true_interaction_print_undecided_never_additive():
    """The issue's done-when: 3 windows, a true +0.05 interaction. No interval → undecided, with what would decide it."""
    from wkvlab.explain.verdict import additivity

    n = window_noise(3, windows=3)
    cells = {"ref": result(0.0, windows=3), "w": result(0.1 + n, nll=1.1, windows=3, weights="int4-g128", kv="fp16"),
             "c": result(0.05 + n, nll=1.2, windows=3), "wc": result(0.2 + 2 * n, nll=1.4, windows=3, weights="int4-g128", kv="int4")}
    f = factorial(cells)
    for metric in ("kld", "ppl"):
        assert f.metric(metric).verdict.outcome == "undecided" and not f.metric(metric).additive
    assert f.top1.verdict is None and not f.top1.additive
    lines = additivity(f)
    assert lines[0].startswith("Undecided") and "Additive" not in lines[0] and "additive" not in lines[0]
    assert "margin ±" in lines[0] and "Holm over 2 tests" in lines[0] and "≥ 8 windows" in lines[0]
    assert "3 windows, skew-robust t" in lines[0]
    assert all("margin ±" in line and "Holm over 2 tests" in line for line in lines[:2])
    assert "no interaction verdict on PPL" in lines[2] and "no verdict" in lines[3]  # PPL, top-1: described only


def test_verdicts_follow_the_margin_and_name_it():
    """8 windows, interaction +0.02 exactly (the noise cancels): beyond m = 10% of KLD(C) (``cache:10%``, the
    rule before issue #38) → compounds; an absolute margin of 0.03 nats (> 0.02) → additive within ±m; the
    default, 10% of the predicted total KLD(W)+KLD(C), is stated with both numbers."""
    f = factorial(_cells(), margin="cache:10%")
    assert f.kld.verdict.outcome == "above" and f.kld.word == "compounds"
    assert f.kld.verdict.margin.value == pytest.approx(0.1 * f.kld.c.estimate) and f.kld.verdict.family_size == 2
    wide = factorial(_cells(), margin="0.03")
    assert wide.kld.verdict.outcome == "within" and wide.kld.additive and "stated by --margin" in wide.kld.verdict.describe()
    default = factorial(_cells())
    total = f.kld.w.estimate + f.kld.c.estimate
    assert default.kld.verdict.margin.value == pytest.approx(0.1 * total)
    assert "10% of the predicted total KLD(W)+KLD(C)" in default.kld.verdict.describe()


def test_non_interacting_cells_never_show_a_ppl_or_top1_interaction_verdict():
    """Issue #38's artifacts: cells built not to interact (W and C each add a fixed NLL and flip tokens
    independently) used to read "PPL compounds" (e^a(e^b−1)(e^c−1)) and "top-1 sub-additive" (−pq) in
    every run. On log PPL the interaction is 0 and additive; top-1 is never decided."""
    rng = np.random.default_rng(3)
    tokens = 256
    flips_w, flips_c = rng.random(tokens) < 0.3, rng.random(tokens) < 0.3  # independent: loss p + q − pq
    kld_w, kld_c = rng.exponential(0.3, tokens), rng.exponential(0.2, tokens)
    cells = {"ref": result(0.0, nll=0.0, weights="none", kv="fp16"),
             "w": result(kld_w, nll=0.5, agree=~flips_w, weights="int4-g128", kv="fp16"),
             "c": result(kld_c, nll=0.4, agree=~flips_c, weights="none", kv="int4"),
             "wc": result(kld_w + kld_c, nll=0.9, agree=~(flips_w | flips_c), weights="int4-g128", kv="int4")}
    f = factorial(cells)
    assert f.ppl.interaction.estimate == pytest.approx(0.0, abs=1e-12) and f.ppl.verdict.outcome == "within"
    assert f.top1.verdict is None and f.top1.interaction.estimate < 0  # the −pq the scale makes, described only
    assert f.kld.verdict.outcome == "within"
    for e in (f.ppl, f.top1):
        assert e.word not in ("compounds", "sub-additive")


def test_replicates_pool_into_every_interval_and_their_disagreement_widens_it():
    """Issue #38 item 3: a second build (another calibration sample, another chunk size) that moves the interaction
    puts that run-to-run variance inside the interval; the verdict names the replicates."""
    base = _cells()
    one = factorial(base)
    moved = dict(base, wc=result(0.17 + 0.004 + 2 * window_noise(), nll=1.4, weights="int4-g128", kv="int4"))
    two = factorial(base, replicates=[moved], variation="chunk sizes 32, 16")
    assert one.replicates == 1 and two.replicates == 2 and two.variation == "chunk sizes 32, 16"
    assert two.kld.interaction.estimate == pytest.approx(0.022)  # the mean of 0.02 and 0.024
    assert one.kld.interaction.high - one.kld.interaction.low == pytest.approx(0.0)  # one run: a point (the noise cancels)
    assert two.kld.interaction.high - two.kld.interaction.low > 0.004 and two.kld.interaction.replicates == 2
    assert "2 replicates (between-replicate variance inside the interval, df 1.0)" in two.kld.verdict.describe()
    assert "1 replicate (run-to-run variance not measured)" in one.kld.verdict.describe()
    assert Factorial.from_dict(json.loads(json.dumps(two.to_dict()))).replicates == 2


def test_replicates_on_other_windows_are_refused():
    other = {k: result(0.1, windows=9, weights=v.weights, kv=v.kv) for k, v in _cells().items()}
    with pytest.raises(DataError):
        factorial(_cells(), replicates=[other])
