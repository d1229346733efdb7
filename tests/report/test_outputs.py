"""Report files: CSV/Markdown contents, escaping, the folder rules, profiles, and the CLI's one-line errors."""
from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from wkvlab.errors import ConfigError, DataError
from wkvlab.report import load_profile, report_from_store, write_report
from wkvlab.report.data import build_report_data
from wkvlab.report.html import NO_PROFILE, script_json
from wkvlab.report.output import MANIFEST
from wkvlab.report.tables import configs_table, cross_term_table, markdown_document, report_tables, to_csv
from wkvlab.store import open_store
from tests.report.helpers import demo_like_grid, profile_payload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data():
    return build_report_data(demo_like_grid("a|b <i>"), source="grid.db", context=4096)


def test_csv_holds_raw_numbers_for_every_config(data):
    rows = list(csv.DictReader(io.StringIO(to_csv(configs_table(data)))))
    assert len(rows) == 12
    row = next(r for r in rows if r["weights"] == "int8" and r["kv"] == "int4")
    assert float(row["memory_at_4096"]) == 100_000_000 + 280.0 * 4096
    assert float(row["kld_mean"]) == pytest.approx(0.014)
    assert row["model"] == "a|b <i>"  # CSV keeps the text as it is
    cross = list(csv.DictReader(io.StringIO(to_csv(cross_term_table(data)))))
    top = next(r for r in cross if r["weights"] == "int4-g128" and r["kv"] == "int4")
    # inside m = 10% of the predicted total KLD(W)+KLD(C) = 0.029 + 0.010 (issue #38; 10% of KLD(C) alone called it "above")
    assert float(top["interaction"]) == pytest.approx(0.003) and top["verdict"] == "within"
    assert float(top["holm_adjusted_low"]) == pytest.approx(0.003)  # every window gives 0.003: no spread to widen
    assert all(r["verdict"] == "within" for r in cross if r is not top)


def test_markdown_escapes_cells_and_formats_intervals(data):
    text = markdown_document(data, report_tables(data))
    assert "a&#124;b &lt;i&gt;" in text and "a|b <i>" not in text  # a '|' in a name must not split the table
    assert ("| int4-g128 | int4 | 0 | +0.00300 [+0.00300, +0.00300] | +0.00300 [+0.00300, +0.00300] | "
            "additive within ±0.0039 (m ±0.0039; Holm over 6 tests (group 0 cross terms)) | 0.04300 | 0.04000 | 0.03000 | 0.01100 | 0.00100 | bf16 |") in text
    assert "## Cross-terms" in text and "## KV-cache penalty" in text


def test_script_json_cannot_close_the_script_element():
    text = script_json({"name": "</script><script>alert(1)</script><!--", "x": float("nan")})
    assert "<" not in text and ">" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script><!--", "x": None}


def test_folder_is_written_rewritten_and_foreign_folders_refused(tmp_path):
    out = tmp_path / "rep"
    first = write_report(demo_like_grid(), out, source="t")
    names = {p.name for p in first.files}
    assert {"index.html", "report.md", "report.json", "configs.csv", "cross_terms.csv", "kv_penalty.csv",
            "g0-memory.png", "g0-penalty.png", "g0-position.png"} == names
    assert all((out / n).read_bytes()[:8] == PNG_MAGIC for n in names if n.endswith(".png"))
    html = (out / "index.html").read_text(encoding="utf-8")
    assert NO_PROFILE.split(".")[0] in html and "id=\"no-profile\"" in html
    assert oct((out / "index.html").stat().st_mode & 0o777) != oct(0o600)

    # A rewrite with fewer charts removes the files the last report wrote and this one does not.
    write_report([r for r in demo_like_grid() if r.kv == "fp16"], out, source="t")
    assert not (out / "g0-penalty.png").exists() and (out / "g0-memory.png").exists()
    assert json.loads((out / MANIFEST).read_text())["files"] == sorted(p.name for p in out.iterdir() if p.name != MANIFEST)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a wkvlab report"):
        write_report(demo_like_grid(), mine, source="t")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match="is a file"):
        write_report(demo_like_grid(), mine / "notes.txt", source="t")


def test_profiles_become_a_heatmap_and_bad_ones_are_one_line(tmp_path):
    good = tmp_path / "p.json"
    payload = profile_payload(layers=3)
    payload["k"]["int4"][1] = float("nan")
    good.write_text(json.dumps(payload))
    profile = load_profile(good)
    assert profile.layers == (0, 1, 2) and profile.columns == ("K int4", "K int8", "V int4", "weights int4-g128")
    assert profile.values[0][0] == pytest.approx(payload["k"]["int4"][0] - 0.004)  # K/V cells: KLD above the base
    assert profile.values[1][0] is None  # a NaN measurement is a blank cell, not a number
    assert profile.values[2][3] == payload["weight_layers"][2]  # weight cells: that layer's KLD itself
    out = write_report(demo_like_grid(), tmp_path / "rep", source="t", profiles=[profile])
    assert (tmp_path / "rep" / "profile0-sensitivity.png").read_bytes()[:8] == PNG_MAGIC
    assert "no-profile" not in out.page.read_text(encoding="utf-8")
    payload["k"]["int8"] = [0.1]
    good.write_text(json.dumps(payload))
    with pytest.raises(DataError, match=r"k\[int8\] should list one number per layer \(3\)"):
        load_profile(good)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(DataError, match="not a wkvlab sensitivity profile"):
        load_profile(bad)
    bad.write_text("{")
    with pytest.raises(DataError, match="not JSON"):
        load_profile(bad)
    with pytest.raises(DataError, match="does not exist"):
        load_profile(tmp_path / "missing.json")


def test_report_from_a_store(tmp_path):
    db = tmp_path / "results.db"
    with open_store(db) as store:
        for i, result in enumerate(demo_like_grid()):
            store.put(f"id{i}", {"score": "all"}, result)
    report = report_from_store(db, tmp_path / "rep", context=2048)
    assert len(report.data.configs) == 12 and len(report.data.cross_terms) == 6
    empty = tmp_path / "empty.db"
    open_store(empty).close()
    with pytest.raises(DataError, match="holds no results"):
        report_from_store(empty, tmp_path / "rep2")
    with pytest.raises(DataError, match="no results store"):
        report_from_store(tmp_path / "missing.db", tmp_path / "rep3")
    assert not (tmp_path / "rep2").exists() and not (tmp_path / "rep3").exists() and not (tmp_path / "missing.db").exists()


def _wkvlab(*args):
    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})


def test_cli_error_for_a_foreign_store_is_one_line(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (x)")
    proc = _wkvlab("report", "--store", str(db), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 2, proc.stderr
    assert "not a wkvlab results store" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "rep").exists()
