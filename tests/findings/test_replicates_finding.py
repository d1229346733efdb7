"""The additivity, methods and calibration findings with replicates: run-to-run variance inside every interval.

Known truths on synthetic grids (no model): replicates that agree leave the interval as one measurement's, and
replicates that disagree widen it by exactly the between-replicate component; the record keeps every replicate's
per-unit values and decides them again; then the finding end to end on a tiny random model, where a store that
holds replicate 0 measures only replicate 1."""
import json
import math

import numpy as np
import pytest

from wkvlab.errors import ConfigError
from wkvlab.eval.result import EvalResult
from wkvlab.findings.analysis import additivity, calibration, method_differences, penalties
from wkvlab.findings.records import redecide
from wkvlab.findings.run import analyse
from tests.findings.test_records import _grid, _outcomes


def _shifted(grid: list[EvalResult], weights: str, kv: str, by: float) -> list[EvalResult]:
    """The grid with ``by`` added to every token's KLD of one cell (another build of that config)."""
    from dataclasses import replace

    return [replace(r, arrays=replace(r.arrays, kld=r.arrays.kld + by)) if (r.weights, r.kv) == (weights, kv) else r for r in grid]


def _row(rows, weights="int4-g128", kv="int4"):
    return next(r for r in rows if (r.weights, r.kv) == (weights, kv))


def test_replicates_that_agree_keep_the_interval_and_ones_that_disagree_widen_it_by_their_spread():
    grid = _grid()
    one = _row(additivity(grid))
    same = _row(additivity(grid, replicates=[grid]))
    assert (one.interaction.replicates, same.interaction.replicates) == (1, 2)
    assert (same.interaction.low, same.interaction.high) == pytest.approx((one.interaction.low, one.interaction.high), rel=1e-12)
    # the second build's W+C cell 0.04 nats higher: the estimate is the replicates' mean, the SE gains (Δ/2)² exactly
    delta = 0.04
    apart = _row(additivity(grid, replicates=[_shifted(grid, "int4-g128", "int4", delta)]))
    assert apart.interaction.estimate == pytest.approx(one.interaction.estimate + delta / 2, rel=1e-9)
    width = one.interaction.high - one.interaction.low  # widths at the same level
    assert apart.interaction.high - apart.interaction.low > 1.5 * width  # 1 df for the replicates: much wider
    from wkvlab.explain.factorial import pooled_effect_draws
    from wkvlab.findings.analysis import _in_runs, _runs

    runs = _runs(grid, [_shifted(grid, "int4-g128", "int4", delta)])
    by = {(r.weights, r.kv): r for r in grid}
    cells = _in_runs(runs, {"ref": by[("none", "fp16")], "w": by[("int4-g128", "fp16")], "c": by[("none", "int4")],
                            "wc": by[("int4-g128", "int4")]})
    draws = pooled_effect_draws(cells, "kld")["interaction"]
    unit_se = pooled_effect_draws(cells[:1], "kld")["interaction"].se  # the shift is constant: the units' part is one run's
    assert draws.se == pytest.approx(math.sqrt(unit_se ** 2 + (delta / 2) ** 2), rel=1e-9)
    assert draws.df < 3  # Welch–Satterthwaite: the replicates' single df dominates
    # the verdict follows: one run compounds; two builds that disagree by more than the effect leave it undecided
    assert one.verdict.word == "compounds"
    wild = _row(additivity(grid, replicates=[_shifted(grid, "int4-g128", "int4", -2 * one.interaction.estimate)]))
    assert wild.verdict.outcome == "undecided" and wild.interaction.contains(0.0)


def test_every_table_of_the_three_findings_pools_its_replicates_and_says_how_many():
    grid, again = _grid(0), _shifted(_grid(0), "w8a8-int8", "int4", 0.01)
    for name in ("additivity", "methods"):
        markdown, data = analyse(name, {("grid",): grid}, "10%", [{("grid",): again}])
        assert data["replicates"] == 2 and "Replicates: 2 replicates pooled into every interval" in markdown
        assert markdown.count("Replicates: ") == (1 if name == "additivity" else 2)  # methods: the penalty and difference tables
        assert _verdicts(data) and all(v["raw"]["replicates"] == 2 for v in _verdicts(data))
    assert all(r.penalty.replicates == 2 for r in penalties(grid, replicates=[again]))
    assert all(d.difference.replicates == 2 for d in method_differences(grid, replicates=[again]))
    cells = {("prose", "default"): _grid(0), ("code", "default"): _grid(1)}
    rows = calibration(cells, replicates=[{k: _shifted(v, "int4-g128", "fp16", 0.01) for k, v in cells.items()}])
    assert {iv.replicates for r in rows for iv in (*r.kld.values(), *r.mismatch.values())} == {2}
    one, _ = analyse("additivity", {("grid",): grid}, "10%")
    assert "Replicates: 1 replicate: run-to-run variance not included" in one


def _verdicts(data):
    from wkvlab.findings.records import dicts_with

    return dicts_with(data, ("outcome", "adjusted"))


@pytest.mark.parametrize("name", ["additivity", "methods", "calibration"])
def test_the_record_keeps_every_replicate_and_decides_them_again_as_the_run_did(name):
    if name == "calibration":
        cells = {("prose", "default"): _grid(0), ("code", "default"): _grid(1)}
        again = [{k: _shifted(v, "int4-g128", "fp16", 0.02) for k, v in cells.items()}]
    else:
        cells = {("grid",): _grid()}
        again = [{("grid",): _shifted(_grid(), "int4-g128", "int4", 0.05)}]
    markdown, data = analyse(name, cells, "10%", again)
    stored = json.loads(json.dumps(data))
    assert stored["units"]["format"] == 2 and sorted({g["replicate"] for g in stored["units"]["grids"]}) == [0, 1]
    markdown_again, decided = redecide(name, stored)
    assert [o[:2] for o in _outcomes(decided)] == [o[:2] for o in _outcomes(data)] and markdown_again == markdown
    # the same record with its replicate dropped is a one-replicate finding, decided (and labelled) as one
    stored["units"]["grids"] = [g for g in stored["units"]["grids"] if g["replicate"] == 0]
    assert "1 replicate: run-to-run variance not included" in redecide(name, stored)[0]


def test_a_record_from_before_replicates_is_decided_as_one_replicate():
    markdown, data = analyse("additivity", {("grid",): _grid()}, "10%")
    old = json.loads(json.dumps(data))
    old["units"]["format"] = 1  # as written before replicates: no replicate on its grids
    for grid in old["units"]["grids"]:
        del grid["replicate"]
    again, decided = redecide("additivity", old)
    assert again == markdown and decided["replicates"] == 1
    old["units"]["format"] = 3
    with pytest.raises(Exception, match="this wkvlab reads 1 and 2"):
        redecide("additivity", old)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("additivity", 0, "--replicates 0 must be at least 1"), ("methods", -1, "must be at least 1"),
    ("depth", 2, "--replicates applies to the additivity, methods and calibration"),
])
def test_a_bad_replicates_is_refused_before_anything_loads(name, value, message):
    from wkvlab.findings.grids import replicate_count

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        replicate_count(name, value)
    assert replicate_count("calibration", None) == 2 and replicate_count("depth", None) == 1


def test_the_finding_measures_only_the_missing_replicate(tiny_folder, tmp_path, monkeypatch):
    """``findings additivity`` with one replicate, then with two: the second run finds replicate 0 in the store and
    measures only replicate 1 (its own config ids, its own chunk, GPTQ built from another calibration sample)."""
    from wkvlab.findings import grids
    from wkvlab.findings.run import run_finding
    from wkvlab.store import open_store

    monkeypatch.setattr(grids, "ADDITIVITY_WEIGHTS", ("none", "gptq-int4-g128"))
    monkeypatch.setattr(grids, "ADDITIVITY_KV", ("fp16", "int4"))
    store = tmp_path / "f.db"
    where = dict(model=tiny_folder, store=store, ctx=32, tokens=8 * 32, device="cpu", dtype="float32")
    first = run_finding("additivity", replicates=1, **where)
    assert "1 replicate: run-to-run variance not included" in first.markdown
    with open_store(store) as db:
        before = {r.config_id for r in db.rows()}
    assert len(before) == 4
    both = run_finding("additivity", replicates=2, **where)
    with open_store(store) as db:
        after = {r.config_id: db.config(r.config_id) for r in db.rows()}
        added = [db.get(i) for i in after if i not in before]
        measured = {(r.weights, r.kv): r for r in db.results(before)}
    assert set(before) < set(after) and len(after) == 8  # replicate 1: four new configs, replicate 0 reused
    assert {after[i]["replicate"] for i in after if i not in before} == {1}
    assert {after[i]["chunk"] for i in after if i not in before} == {16}  # windows of 32 in one chunk; replicate 1: halves
    again = {(r.weights, r.kv): r for r in added}
    # another calibration sample is another GPTQ build: its W cell's KLD differs from replicate 0's
    key = next(k for k in again if k[0].startswith("gptq") and k[1] == "fp16")
    assert not np.allclose(again[key].arrays.kld, measured[key].arrays.kld)
    assert np.array_equal(again[key].arrays.window, measured[key].arrays.window)  # on the same windows
    (row,) = both.data["rows"]
    assert row["interaction"]["replicates"] == 2 and both.data["replicates"] == 2
    assert "Replicates: 2 replicates pooled" in both.markdown


@pytest.mark.slow
def test_the_cli_measures_the_whole_additivity_grid_twice_at_the_smallest_size(tiny_folder, tmp_path):
    """`wkvlab findings additivity --replicates 2` as a user runs it, the whole grid (7 weight methods × 8 caches) at
    8 windows of 32 tokens: about 2 minutes on the 2 shared cores (the reduced grid above is the fast tier's)."""
    import os

    from typer.testing import CliRunner

    from wkvlab.cli import app

    store, markdown = tmp_path / "f.db", tmp_path / "additivity.md"
    args = ["findings", "additivity", "--model", tiny_folder, "--ctx", "32", "--tokens", "256", "--replicates", "2",
            "--store", str(store), "--markdown", str(markdown), "--threads", "1"]
    run = CliRunner().invoke(app, args, env={**os.environ, "COLUMNS": "250"})
    assert run.exit_code == 0, run.output
    text = markdown.read_text()
    assert text.count("| ") > 40 and "Replicates: 2 replicates pooled into every interval" in text
    from wkvlab.store import open_store

    with open_store(store) as db:
        assert len(db) == 2 * 56
