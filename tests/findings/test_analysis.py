"""Findings tables on grids with a known answer (synthetic per-token arrays, no model)."""
import numpy as np
import pytest

from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.findings.analysis import additivity, calibration, method_differences, penalties
from wkvlab.findings.render import additivity_markdown, calibration_markdown, penalty_markdown
from wkvlab.kv import KVSpec
from wkvlab.weights.spec import WeightSpec

WINDOWS, CTX = 32, 65


def _result(weights: str, kv: str, kld: np.ndarray) -> EvalResult:
    n = CTX - 1
    arrays = TokenArrays(kld=kld, nll_ref=np.zeros(kld.size), nll=np.zeros(kld.size), top1_agree=np.ones(kld.size, bool),
                         delta_p=np.zeros(kld.size), position=np.tile(np.arange(n), WINDOWS), window=np.repeat(np.arange(WINDOWS), n))
    return EvalResult("m", "d", CTX, weights, kv, WeightSpec.parse(weights).to_dict(), KVSpec.parse(kv).to_dict(), 0, 0.0, 0.0,
                      arrays, position_buckets(CTX))


def _grid(interaction: float, noise: float = 0.01):
    rng = np.random.default_rng(0)
    size = WINDOWS * (CTX - 1)
    per_window = np.repeat(rng.normal(0, 0.02, WINDOWS), CTX - 1)  # windows differ; pairing should cancel it
    w = 0.30 + per_window + rng.normal(0, noise, size)
    c = 0.10 + per_window + rng.normal(0, noise, size)
    wc = w + c + interaction + rng.normal(0, noise, size)
    return [_result("none", "fp16", np.zeros(size)), _result("none", "int4", c), _result("int4-g128", "fp16", w), _result("int4-g128", "int4", wc)]


def test_compounding_is_found_and_decided():
    (row,) = additivity(_grid(interaction=0.05))
    assert (row.weights, row.kv) == ("int4-g128", "int4")
    assert row.interaction.estimate == pytest.approx(0.05 - 0.0, abs=0.01)  # wc − w − c, per_window counted twice in wc
    assert row.interaction.low > 0 and row.verdict.word == "compounds" and row.tokens_needed is None
    assert row.verdict.margin.value == pytest.approx(0.1 * (row.w.estimate + row.c.estimate))  # of the predicted total
    assert row.share == pytest.approx(row.interaction.estimate / (row.w.estimate + row.c.estimate))
    assert row.share_of_cache == pytest.approx(row.interaction.estimate / row.c.estimate)
    text = additivity_markdown([row])
    assert "compounds" in text and "Holm over 1 test" in text and "margin m = 10%" in text


def test_additive_grid_is_additive_within_the_margin():
    (row,) = additivity(_grid(interaction=0.0))
    assert row.interaction.decided and row.verdict.outcome == "within"
    assert row.verdict.adjusted.low >= -row.verdict.margin.value and row.verdict.adjusted.high <= row.verdict.margin.value


def test_an_interval_wider_than_the_margin_is_undecided_not_additive():
    # per-token noise 1.5 against a cache effect of 0.10: the interval holds 0 but cannot tell 0 from ±m
    (row,) = additivity(_grid(interaction=0.0, noise=1.5))
    assert row.interaction.contains(0.0) and row.verdict.outcome == "undecided"
    # sized for 80% power at this estimate (stats.decision.units_to_decide): more than it has, in whole units
    assert row.verdict.units_needed > row.interaction.n_units
    assert row.tokens_needed == int(np.ceil(row.tokens * row.verdict.units_needed / row.interaction.n_units))
    assert f"~{row.tokens_needed:,} tokens" in additivity_markdown([row])


def test_the_grid_is_one_family():
    """Two rows: each verdict is Holm-adjusted over both, and its adjusted interval is wider than its raw one."""
    grid = _grid(interaction=0.05)
    extra = _grid(interaction=0.0)
    grid += [_result("none", "int8", extra[1].arrays.kld), _result("int4-g128", "int8", grid[2].arrays.kld + extra[1].arrays.kld)]
    rows = additivity(grid)
    assert len(rows) == 2 and all(r.verdict.family_size == 2 for r in rows)
    assert all(r.verdict.adjusted.low <= r.interaction.low and r.verdict.adjusted.high >= r.interaction.high for r in rows)
    assert "Holm over 2 tests" in additivity_markdown(rows)


def test_methods_difference_is_the_additivity_interaction():
    # a reference cell that is not exactly 0 (an fp16 cache on float32 weights is not lossless)
    grid = _grid(interaction=0.05)
    grid[0] = _result("none", "fp16", np.full(grid[0].arrays.kld.size, 0.004))
    (row,) = additivity(grid)
    versus = {(r.weights, r.kv): r for r in penalties(grid)}[("int4-g128", "int4")].vs_unquantized
    assert (versus.estimate, versus.low, versus.high) == (row.interaction.estimate, row.interaction.low, row.interaction.high)


def test_results_on_other_tokens_are_refused():
    from wkvlab.errors import DataError

    grid = _grid(interaction=0.0)
    other = grid[3]
    other.arrays.nll_ref[:] = 1.0  # same shapes, other reference losses: not the same tokens
    with pytest.raises(DataError, match="same tokens"):
        additivity(grid)


def test_a_grid_without_its_reference_cell_is_refused():
    from wkvlab.errors import DataError

    with pytest.raises(DataError, match="add weights 'none' and kv 'fp16'"):
        additivity(_grid(interaction=0.0)[1:])


def test_search_and_engine_check_their_own_windows_not_the_grids():
    from wkvlab.errors import ConfigError
    from wkvlab.findings import grids
    from wkvlab.findings.run import run_finding

    assert grids.search_grid("default", tokens=300).profile_tokens == 300  # the search window is 256, not the grids' 512
    with pytest.raises(ConfigError, match="less than one window of --ctx 1024"):  # the engine's window
        run_finding("engine", model="default", tokens=256)


def test_penalty_under_quantized_weights_and_its_difference():
    rows = {(r.weights, r.kv): r for r in penalties(_grid(interaction=0.05))}
    plain, under = rows[("none", "int4")], rows[("int4-g128", "int4")]
    assert plain.penalty.estimate == pytest.approx(0.10, abs=0.01) and plain.vs_unquantized is None
    assert under.penalty.estimate == pytest.approx(0.15, abs=0.01)  # c + interaction
    assert under.vs_unquantized.low > 0 and under.verdict.outcome == "above"
    text = penalty_markdown(list(rows.values()))
    assert "↑" in text and "Holm over 1 test" in text


def test_calibration_mismatch_is_paired_against_the_own_domain():
    rng = np.random.default_rng(1)
    size = WINDOWS * (CTX - 1)
    grid = {}
    for calib, level in (("prose", 0.10), ("code", 0.13), ("math", 0.12)):
        grid[(calib, "default")] = [_result("none", "fp16", np.zeros(size)), _result("gptq-int4-g128", "fp16", level + rng.normal(0, 0.01, size))]
    (row,) = calibration(grid)
    assert row.own == "prose" and set(row.mismatch) == {"code", "math"}
    assert row.mismatch["code"].estimate == pytest.approx(0.03, abs=0.005) and row.mismatch["code"].low > 0
    assert row.verdicts["code"].word == "higher" and row.verdicts["code"].family_size == 2
    markdown = calibration_markdown([row])
    assert "calibrated on code" in markdown and "Holm over 2 tests" in markdown
    # each cost shows its raw and its Holm-adjusted interval and m; the footnote's margin names the own domain, not the first row's
    v = row.verdicts["code"]
    assert f"({format(v.adjusted, '+.4f')}; ±{v.margin.value:.2g}) → higher" in markdown
    assert "m = 10% of the KLD calibrated on the evaluated text's own domain" in markdown


def test_a_calibration_text_other_than_prose_code_math_is_accepted():
    rng = np.random.default_rng(2)
    size = WINDOWS * (CTX - 1)
    grid = {(calib, "default"): [_result("gptq-int4-g128", "fp16", level + rng.normal(0, 0.01, size))]
            for calib, level in (("prose", 0.10), ("legal", 0.11))}
    (row,) = calibration(grid)
    assert set(row.mismatch) == {"legal"}


def test_engine_markdown_shows_ratio_and_window_spread():
    from wkvlab.findings.render import engine_markdown

    row = {"kv": "q4_0", "preset": "llamacpp:q4_0", "engine_kld": {"mean": 0.05, "se": 0.001}, "sim_kld": {"mean": 0.047, "se": 0.001},
           "ratio": 0.94, "window_ratios": [0.92, 0.97], "engine_top1": 0.868, "sim_top1": 0.873}
    text = engine_markdown({"rows": [row], "noise_floor": {"mean": 0.003, "se": 0.0001}, "model": "m", "tokens": 4092, "ctx": 1024,
                            "data": "default", "seconds": 12.0})
    assert "| q4_0 | llamacpp:q4_0 | 0.050000 ± 0.001000 | 0.047000 ± 0.001000 | **0.94** | 0.92–0.97 | 86.8% / 87.3% |" in text


def test_finding_sweeps_run_one_weight_config_per_task():
    # stored as each weight config finishes (resumable), one quantized copy in memory at a time
    from wkvlab.findings import grids
    from wkvlab.sweep.run import plan_sweep

    size = grids.size_for("default", tokens=1024, ctx=512)
    for spec in [*grids.additivity_sweeps("default", size), *grids.calibration_sweeps("default", size)]:
        plan = plan_sweep(spec, None)
        assert all(len({c.label.split(" × ")[0] for c in t.configs}) == 1 for t in plan.tasks), spec.name
        assert len(plan.tasks) == len(spec.weights)


def test_weight_methods_are_compared_as_differences():
    """A significant row next to a non-significant one is not a difference: the pair is tested itself."""
    grid = _grid(interaction=0.05)  # int4-g128 compounds with int4
    rng = np.random.default_rng(3)
    size = WINDOWS * (CTX - 1)
    w2 = 0.20 + rng.normal(0, 0.01, size)
    grid += [_result("gptq-int4-g128", "fp16", w2), _result("gptq-int4-g128", "int4", w2 + grid[1].arrays.kld + rng.normal(0, 0.01, size))]
    (d,) = method_differences(grid)
    assert (d.kv, d.a, d.b) == ("int4", "int4-g128", "gptq-int4-g128")
    assert d.difference.estimate == pytest.approx(0.05, abs=0.01) and d.verdict.word == "higher"
    assert d.verdict.margin.value == pytest.approx(0.1 * grid[1].arrays.kld.mean())
    from wkvlab.findings.render import method_differences_markdown

    assert "int4-g128 − gptq-int4-g128" in method_differences_markdown([d])
    # the footnote's basis holds for every row of the family, not only for the first row's cache
    assert "m = 10% of KLD(C), the row's cache under unquantized weights" in method_differences_markdown([d])


def test_calibration_table_shows_each_replicates_cost_where_several_are_pooled():
    """Two builds whose costs are +0.03 and +0.05: the pooled cost is +0.04 and the table names both, so a reader sees
    the spread that sets the interval's width at two replicates (the SmolLM2 record: GPTQ's math costs +0.146 and +0.168)."""
    rng = np.random.default_rng(3)
    size = WINDOWS * (CTX - 1)
    base = rng.normal(0, 0.01, size)

    def grids(math_cost):
        return {(calib, "default"): [_result("gptq-int4-g128", "fp16", level + base)]
                for calib, level in (("prose", 0.10), ("math", 0.10 + math_cost))}

    (one,) = calibration(grids(0.03))
    assert one.mismatch["math"].replicate_estimates == () and "{replicates" not in calibration_markdown([one])
    (row,) = calibration(grids(0.03), replicates=[grids(0.05)])
    cost = row.mismatch["math"]
    assert cost.estimate == pytest.approx(0.04) and cost.replicate_estimates == pytest.approx((0.03, 0.05))
    assert "math: +0.0400 [" in calibration_markdown([row]) and "{replicates +0.0300, +0.0500} (" in calibration_markdown([row])
    assert row.verdicts["math"].adjusted.replicate_estimates == pytest.approx((0.03, 0.05))


def test_additivity_and_method_tables_show_each_replicates_estimate_where_several_are_pooled():
    """Two replicates whose interactions are +0.05 and +0.07: the row pools +0.06 and prints both, with the line that
    reads the braces; one replicate prints neither."""
    (one,) = additivity(_grid(interaction=0.05))
    assert "{replicates" not in additivity_markdown([one])
    (row,) = additivity(_grid(interaction=0.05), replicates=[_grid(interaction=0.07)])
    first, second = row.interaction.replicate_estimates
    assert second - first == pytest.approx(0.02) and row.interaction.estimate == pytest.approx((first + second) / 2)
    assert first == pytest.approx(one.interaction.estimate)
    text = additivity_markdown([row])
    assert f"{{replicates {first:+.5f}, {second:+.5f}}} |" in text and "{replicates …}: each replicate's own interaction." in text

    def grid(gap):
        rng = np.random.default_rng(1)
        size = WINDOWS * (CTX - 1)
        cells = _grid(interaction=0.0)
        w2 = 0.20 + rng.normal(0, 0.01, size)
        return cells + [_result("gptq-int4-g128", "fp16", w2), _result("gptq-int4-g128", "int4", w2 + cells[1].arrays.kld + gap)]

    from wkvlab.findings.render import method_differences_markdown

    (d,) = method_differences(grid(0.050), replicates=[grid(0.051)])  # close replicates: decided, so listed
    first, second = d.difference.replicate_estimates
    assert first - second == pytest.approx(0.001) and d.verdict.decided
    assert "{replicates -0.0" in method_differences_markdown([d]) and "each replicate's own difference" in method_differences_markdown([d])
