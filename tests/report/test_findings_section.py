"""The findings in the report: each stored finding becomes a section with its table (intervals in the CSV) and chart."""
import csv
import io
import json

import pytest

from tests.findings.test_analysis import _grid
from tests.report.helpers import demo_like_grid
from wkvlab.findings.analysis import additivity, penalties
from wkvlab.report import report_from_store
from wkvlab.report.build import render_report
from wkvlab.report.data import build_report_data
from wkvlab.report.findings import finding_sections
from wkvlab.store import open_store
from wkvlab.store.findings import StoredFinding

IV = {"estimate": 0.02, "low": 0.01, "high": 0.03, "level": 0.95, "n_units": 64, "n_resamples": 200, "decided": True}
NO_IV = {"estimate": 0.0, "low": None, "high": None, "level": 0.95, "n_units": 1, "n_resamples": 0, "decided": False}


def _findings():
    grid = _grid(interaction=0.05)
    depth = {"tables": [{"weights": "none", "kv": "q4_0", "paired_with": "the reference", "unit": "blocks of 256 positions", "block": 256,
                         "decorrelation_lag": 3, "units": 128,
                         "rows": [{"start": 0, "end": 4096, "tokens": 4095, "penalty": IV, "growth": None, "relative_growth": None},
                                  {"start": 4096, "end": 8192, "tokens": 4096, "penalty": {**IV, "estimate": 0.025}, "growth": IV,
                                   "relative_growth": 1.0}]}]}
    search = {"rows": [{"profile_text": "default", "budget": 7603.2, "share": 0.33, "heldout_text": "code", "aware": 0.6, "unaware": 0.55,
                        "uniform_name": "K4V4", "uniform": 0.62, "tokens": 496, "aware_minus_unaware": IV, "aware_minus_uniform": None}],
              "rank_correlation": {"default -> code": 0.5}, "layer_agreement": {}, "plans": {}}
    engine = {"rows": [{"kv": "q4_0", "preset": "llamacpp:q4_0", "engine_kld": {"mean": 0.05, "se": 0.001}, "sim_kld": {"mean": 0.047, "se": 0.001},
                        "ratio": 0.94, "window_ratios": [0.9], "engine_top1": 0.8, "sim_top1": 0.81}]}
    return [StoredFinding("additivity", "default", 0.0, 10.0, {"rows": [r.to_dict() for r in additivity(grid)]}, ""),
            StoredFinding("methods", "default", 0.0, 10.0, {"rows": [r.to_dict() for r in penalties(grid)]}, ""),
            StoredFinding("depth", "gemma3-270m", 0.0, 10.0, depth, ""),
            StoredFinding("search", "default", 0.0, 10.0, search, ""),
            StoredFinding("engine", "default", 0.0, 10.0, engine, "")]


def test_each_finding_gets_a_table_whose_csv_keeps_the_interval_ends():
    sections = finding_sections(_findings())
    assert [s.table.name for s in sections] == ["finding-additivity-default", "finding-methods-default", "finding-depth-gemma3-270m",
                                                "finding-search-default", "finding-engine-default"]
    add = sections[0]
    (row,) = add.table.rows
    shown = dict(zip([c.header for c in add.table.shown], add.table.text_rows()[0]))
    raw = dict(zip([c.header for c in add.table.columns], add.table.raw_rows()[0]))
    iv = row["interaction"]
    assert shown["interaction"] == f"{iv['estimate']:+.5f} [{iv['low']:+.5f}, {iv['high']:+.5f}]"
    assert (raw["interaction low"], raw["interaction high"]) == (iv["low"], iv["high"]) and iv["low"] > 0
    assert shown["verdict"].startswith("compounds (m ±0.0") and shown["verdict"].endswith("; Holm over 1 test (m additivity grid))")
    old = {k: v for k, v in row.items() if k not in ("decision", "share_of_cache")}  # a finding stored before the one rule
    (section,) = finding_sections([StoredFinding("additivity", "default", 0.0, 1.0, {"rows": [{**old, "verdict": "additive"}]}, "")])
    shown = dict(zip([c.header for c in section.table.shown], section.table.text_rows()[0]))
    assert shown["verdict"] == "additive (old rule: rerun pending)" and shown["% of KLD(C)"] == "—"
    depth = sections[2]
    assert [r[3] for r in depth.table.text_rows()] == ["+0.02000 [+0.01000, +0.03000]", "+0.02500 [+0.01000, +0.03000]"]
    assert depth.table.text_rows()[0][4] == "—"  # the first bucket has no growth
    (chart,) = depth.charts
    assert chart.x_categories == ("0–4,096", "4,096–8,192") and chart.series[0].error_low == pytest.approx((0.01, 0.015))
    search = sections[3]
    assert search.table.text_rows()[0][-1] == "—"  # no uniform fits: no interval, not a number
    assert search.charts[0].series[0].y == (0.02,)


def test_undecided_intervals_show_why_not_a_range():
    f = _findings()[2]
    f.data["tables"][0]["rows"][1]["growth"] = NO_IV
    (section,) = finding_sections([f])
    assert section.table.text_rows()[1][4] == "+0.00000 [no interval: 1 < 8 units]"  # the wording of Interval itself
    assert section.charts[0].series[0].error_high[1] == pytest.approx(0.005)  # the penalty's own interval still draws


def test_the_report_from_a_store_shows_its_findings(tmp_path):
    db = tmp_path / "results.db"
    with open_store(db) as store:
        for i, result in enumerate(demo_like_grid()):
            store.put(f"id{i}", {"score": "all"}, result)
        for f in _findings():
            store.put_finding(f.name, f.model, f.seconds, f.data, f.markdown)
    report = report_from_store(db, tmp_path / "rep")
    names = {p.name for p in report.files}
    assert {"finding-additivity-default.csv", "finding-depth-gemma3-270m.csv", "finding0-additivity.png", "finding4-engine.png"} <= names
    page = (tmp_path / "rep" / "index.html").read_text()
    assert 'id="findings"' in page and "Additive or compounding" in page and "Engine confirmation" in page
    rows = list(csv.DictReader(io.StringIO((tmp_path / "rep" / "finding-engine-default.csv").read_text())))
    assert rows[0]["ratio"] == "0.94"
    assert [f["name"] for f in json.loads((tmp_path / "rep" / "report.json").read_text())["findings"]] == [
        "additivity", "methods", "depth", "search", "engine"]


def test_a_report_without_findings_has_no_findings_section():
    files = render_report(build_report_data(demo_like_grid(), source="s"))
    assert b'id="findings"' not in files["index.html"] and not any(n.startswith("finding") for n in files)


def test_calibration_and_methods_sections_show_the_rules_verdicts():
    import numpy as np

    from tests.findings.test_analysis import CTX, WINDOWS, _result
    from wkvlab.findings.analysis import calibration

    rng = np.random.default_rng(1)
    size = WINDOWS * (CTX - 1)
    grid = {(c, "default"): [_result("gptq-int4-g128", "fp16", level + rng.normal(0, 0.01, size))] for c, level in (("prose", 0.1), ("code", 0.13))}
    rows = [r.to_dict() for r in calibration(grid)]
    methods = [r.to_dict() for r in penalties(_grid(interaction=0.05))]
    cal, meth = finding_sections([StoredFinding("calibration", "default", 0.0, 1.0, {"rows": rows}, ""),
                                  StoredFinding("methods", "default", 0.0, 1.0, {"rows": methods}, "")])
    shown = dict(zip([c.header for c in cal.table.shown], cal.table.text_rows()[0]))
    assert shown["verdict on code"].startswith("higher (m ±") and "Holm over 1 test" in shown["verdict on code"]
    assert any("Holm over 1 test" in row[-1] for row in meth.table.text_rows())
