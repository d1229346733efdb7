"""plan --tolerance (issue 38 item 6, issue 41 item 2): the ship decision as the planner's verdict rule."""
from __future__ import annotations

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from wkvlab.kv.spec import KVSpec
from wkvlab.plan import plan
from wkvlab.plan.cli import plan_command
from wkvlab.plan.measured import Measurement, UnitValues
from wkvlab.plan.verdict import EXCEEDS, UNDECIDED, WITHIN, tolerance_rule
from wkvlab.stats.tolerance import Tolerance
from wkvlab.weights.spec import WeightSpec

TAU = Tolerance.parse("0.01")


def probed(model: str, weights: str, kv: str, unit_kld, tokens_per_unit: int = 256, top1: float = 0.98) -> Measurement:
    """A probe's measurement with these per-unit mean KLDs (equal-sized units), as Probe.measurement builds it."""
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    kld = np.asarray(unit_kld, dtype=np.float64)
    units = UnitValues("documents", (tokens_per_unit,) * kld.size, tuple(kld), (top1,) * kld.size)
    return Measurement(model, "default", 256, tokens_per_unit * kld.size, w.label, k.label, float(kld.mean()),
                       float(kld.std(ddof=1) / np.sqrt(kld.size)), "test", w.to_dict(), k.to_dict(), top1=top1, kind="probe", units=units)


def spread(centre: float, n: int = 16, rel: float = 0.1) -> np.ndarray:
    """n per-unit values around ``centre`` (±rel), deterministic."""
    return centre * (1 + rel * np.linspace(-1, 1, n))


def rows_of(result):
    return {(r.weights, r.kv): r for r in result.rows}


def test_unit_values_keep_the_token_weighted_mean_and_decide_on_it():
    kld = np.array([0.1, 0.3, 0.2, 0.0])
    top1 = np.array([1, 0, 1, 1], dtype=bool)
    units = UnitValues.from_arrays(kld, top1, np.array([0, 0, 1, 1]))
    assert units.tokens == (2, 2) and units.kld == pytest.approx((0.2, 0.1)) and units.top1 == pytest.approx((0.5, 1.0))
    values, labels = units.per_token("top1")
    assert values.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0]) and labels.kind == "units"


def test_within_is_recommended_exceeds_is_dropped_undecided_says_what_decides_it(model_dir):
    rng = np.random.default_rng(0)
    measured = [probed("tinyplan", "none", "int8", spread(0.001)),  # all units far below 0.01: within
                probed("tinyplan", "none", "int4", spread(0.05)),  # all far above: exceeds
                probed("tinyplan", "none", "fp8_e4m3", 0.0095 + 0.004 * rng.standard_normal(16))]  # straddles τ: undecided
    result = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=measured, verdict=tolerance_rule(TAU))
    rows = rows_of(result)
    within, exceeds, undecided = rows[("bf16", "int8")], rows[("bf16", "int4")], rows[("bf16", "fp8_e4m3")]
    assert within.verdict.state == WITHIN and within.recommendable and within.rank == 1
    assert "Holm over 3 configs" in within.verdict.reason and "16 documents" in within.verdict.reason
    assert exceeds.verdict.state == EXCEEDS and exceeds.verdict.dropped and exceeds.rank is None and not exceeds.recommendable
    assert any("exceeds it (mean KLD ≤ 0.01 nats)" in note for note in exceeds.ranking_notes)
    assert undecided.verdict.state == UNDECIDED and not undecided.recommendable
    assert "tokens (" in undecided.verdict.reason and "would decide it with 80% power" in undecided.verdict.reason
    assert undecided.rank is not None and any(n.startswith("ordered by the measured KLD") for n in undecided.ranking_notes)
    rec = result.recommendations[0]
    assert (rec.weights, rec.kv) == ("bf16", "int8") and rec.verified
    assert any("the smallest shown within tolerance" in line for line in rec.why)
    assert any(line.startswith("dropped bf16 x int4: exceeds it") and "unsafe =" not in line for line in rec.why)


def test_a_prior_or_a_measurement_without_unit_values_is_never_recommended(model_dir):
    w, k = WeightSpec.parse("none"), KVSpec.parse("int8")
    summary_only = Measurement("tinyplan", "default", 512, 4096, w.label, k.label, 0.0001, 0.00001, "test", w.to_dict(), k.to_dict(),
                               top1=0.999)  # an eval --json file: a mean and its SE, no per-unit values
    result = plan(str(model_dir), "RTX-4090", 4, 1024, measurements=[summary_only], verdict=tolerance_rule(TAU))
    for row in result.rows:
        if row.quality.exact:
            assert row.verdict.state == WITHIN and row.recommendable
            continue
        assert row.verdict.state == UNDECIDED and not row.recommendable, (row.weights, row.kv)
        assert ("unmeasured" in row.verdict.reason) != (row.kv == "int8" and row.weights == "bf16")
    assert "kept no per-unit values" in rows_of(result)[("bf16", "int8")].verdict.reason
    assert all(r.weights == "bf16" and r.kv == "bf16" for r in result.recommendations if r.verified)


def test_the_smallest_memory_within_tolerance_wins_over_a_more_faithful_larger_one():
    """Llama-3-8B on a 24 GB card at 8 x 8192: the 16-bit checkpoint does not fit, memory is the constraint."""
    faithful = probed("llama-3-8b", "fp8", "int8", spread(0.002))
    small = probed("llama-3-8b", "int4-g128", "int8", spread(0.006))
    args = ("llama-3-8b", "RTX-4090", 8, 8192)
    kw = dict(weights=["fp8", "int4-g128"], kv=["int8"], engine="vllm", measurements=[faithful, small])
    tolerant = rows_of(plan(*args, **kw, verdict=tolerance_rule(TAU)))
    assert tolerant[("int4-g128", "int8")].rank == 1 and tolerant[("fp8", "int8")].rank == 2
    assert all(r.verdict.state == WITHIN for r in tolerant.values() if r.rank)
    guarded = rows_of(plan(*args, **kw))  # without --tolerance: today's rule, the more faithful first
    assert guarded[("fp8", "int8")].rank == 1
    # a tolerance the small config is not shown within: the faithful one is recommended
    strict = plan(*args, **kw, verdict=tolerance_rule(Tolerance.parse("0.004")))
    assert rows_of(strict)[("int4-g128", "int8")].verdict.state == EXCEEDS
    assert (strict.recommendations[0].weights, strict.recommendations[0].kv) == ("fp8", "int8")


def test_a_top1_tolerance_tests_the_loss_of_agreement(model_dir):
    good = probed("tinyplan", "none", "int8", spread(0.001), top1=0.995)
    bad = probed("tinyplan", "none", "int4", spread(0.002), top1=0.90)
    rows = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=[good, bad],
                        verdict=tolerance_rule(Tolerance.parse("top1=0.95"))))
    assert rows[("bf16", "int8")].verdict.state == WITHIN and rows[("bf16", "int4")].verdict.state == EXCEEDS


def _app():
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.callback()(lambda: None)
    return app


def test_cli_tolerance_lists_every_row_and_refuses_a_bad_one_in_one_line(model_dir):
    out = CliRunner().invoke(_app(), ["plan", "-m", str(model_dir), "-g", "rtx-4090", "-b", "4", "-c", "1024", "--tolerance", "0.01"])
    assert out.exit_code == 0, out.output
    assert "against your tolerance" in out.output and "row(s) on a prior only: undecided, unmeasured" in out.output
    bad = CliRunner().invoke(_app(), ["plan", "-m", str(model_dir), "-g", "rtx-4090", "-b", "4", "-c", "1024", "--tolerance", "top1=2"])
    assert bad.exit_code != 0 and "top-1 agreement is between 0 and 1" in str(bad.exception or bad.output)


def _documented(model: str, weights: str, kv: str, unit_kld, tokens_per_unit: int = 64):
    """An EvalResult over len(unit_kld) documents of one window each, every token of document i at unit_kld[i]."""
    from wkvlab.eval.metrics import position_buckets
    from wkvlab.eval.result import EvalResult, TokenArrays

    kld = np.repeat(np.asarray(unit_kld, dtype=np.float64), tokens_per_unit)
    n, units = kld.size, np.repeat(np.arange(len(unit_kld)), tokens_per_unit)
    arrays = TokenArrays(kld=kld, nll_ref=np.full(n, 2.0), nll=np.full(n, 2.0), top1_agree=np.ones(n, bool), delta_p=np.zeros(n),
                         position=np.tile(np.arange(tokens_per_unit), len(unit_kld)), window=units, document=units)
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    return EvalResult(model=model, data="default", ctx=tokens_per_unit + 1, weights=w.label, kv=k.label, weights_spec=w.to_dict(),
                      kv_spec=k.to_dict(), weight_bytes=1, kv_bytes_per_token=1.0, seconds=0.1, arrays=arrays,
                      buckets=position_buckets(tokens_per_unit + 1))


def test_results_and_store_carry_per_unit_values_so_a_tolerance_decides_them(model_dir, tmp_path):
    """eval --json and a sweep store keep per-document values: plan --results/--store --tolerance decides on them,
    as it does on a probe's (before: every such row stayed undecided)."""
    import json

    from wkvlab.plan import load_measurements
    from wkvlab.store import open_store

    good, bad = _documented("tinyplan", "none", "int8", spread(0.001)), _documented("tinyplan", "none", "int4", spread(0.05))
    assert good.to_dict()["units"] == {"unit": "documents", "tokens": [64] * 16, "kld": pytest.approx(list(spread(0.001))),
                                       "top1": [1.0] * 16}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps([good.to_dict(), bad.to_dict()]))
    db = tmp_path / "sweep.db"
    with open_store(db) as store:
        for i, r in enumerate((good, bad)):
            store.put(f"id{i}", {"weights": r.weights_spec, "kv": r.kv_spec, "score": "all"}, r)
    for measured in (load_measurements([path]), load_measurements(stores=[db])):
        assert [m.units.kld for m in measured] == [pytest.approx(tuple(spread(0.001))), pytest.approx(tuple(spread(0.05)))]
        rows = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=measured, verdict=tolerance_rule(TAU)))
        assert rows[("bf16", "int8")].verdict.state == WITHIN and rows[("bf16", "int8")].recommendable
        assert rows[("bf16", "int4")].verdict.state == EXCEEDS and "16 documents" in rows[("bf16", "int4")].verdict.reason


def test_an_old_results_file_without_unit_values_reads_and_stays_undecided_with_a_re_run_note(model_dir, tmp_path):
    import json

    from wkvlab.plan import load_measurements

    old = _documented("tinyplan", "none", "int8", spread(0.001)).to_dict()
    del old["units"]  # as eval --json wrote it before per-unit values were recorded
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    (m,) = load_measurements([path])
    assert m.units is None and m.kld == pytest.approx(0.001)
    row = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=[m], verdict=tolerance_rule(TAU)))[("bf16", "int8")]
    assert row.verdict.state == UNDECIDED and not row.recommendable
    assert "kept no per-unit values" in row.verdict.reason and "re-run its 'wkvlab eval ... --json'" in row.verdict.reason
    assert str(path) in row.verdict.reason


def test_cli_tolerance_over_several_gpu_counts_shows_each_decision(model_dir):
    """plan --gpus 1,2 --tolerance: the side-by-side view keeps the tolerance section and the verdict column (it had neither)."""
    out = CliRunner().invoke(_app(), ["plan", "-m", str(model_dir), "-g", "rtx-4090", "-b", "4", "-c", "1024", "-n", "1,2",
                                      "--tolerance", "0.01"], terminal_width=250)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert text.count("against your tolerance") == 2 and text.count("row(s) on a prior only: undecided, unmeasured") == 2
    assert "within tolerance" in text  # the checkpoint itself, recommended under the tolerance on each count
