"""Downstream-task scores next to KLD in the report: the join, the table, the chart, the page section."""
import csv
import io
import json
import math

from tests.report.helpers import demo_like_grid, make_result
from wkvlab.report import report_from_store
from wkvlab.report.build import render_report
from wkvlab.report.data import build_report_data, group_results
from wkvlab.report.tasks import task_charts, task_rows
from wkvlab.store import open_store
from wkvlab.store.tasks import TaskScore


def _score(weights, kv, value, model="tiny", cid=None, task="facts"):
    return TaskScore(cid or f"{weights}|{kv}", task, "acc,none", model, "m" + model, weights, kv, value, 0.05, 8)


def test_scores_join_their_configs_kld_in_every_group_and_stand_alone_without_one():
    grid = demo_like_grid() + [make_result("int8", "int4", 0.2, ctx=32)]  # int8 × int4 measured at a second window length
    scores = [_score("int8", "int4", 0.625), _score("bf16", "fp16", 0.75), _score("int8", "int4", 0.5, model="other")]
    rows = task_rows(group_results(grid), scores)
    by = {(r.weights, r.kv, r.group, r.model): r for r in rows}
    klds = {(r.ctx, r.weights, r.kv): r.kld["mean"] for r in grid}
    assert by[("int8", "int4", 0, "tiny")].kld_mean == klds[(64, "int8", "int4")]
    assert by[("int8", "int4", 1, "tiny")].kld_mean == klds[(32, "int8", "int4")] and by[("int8", "int4", 1, "tiny")].value == 0.625
    assert by[("bf16", "fp16", 0, "tiny")].top1 == grid[0].top1_agreement
    lone = by[("int8", "int4", None, "other")]  # another model file: no KLD to put next to it
    assert math.isnan(lone.kld_mean) and lone.group_label == "no KLD result"
    assert len(rows) == 4
    charts = task_charts(rows)  # one per group × task metric; the lone score draws nowhere
    assert [c.id for c in charts] == ["task0-facts", "task1-facts"]
    assert [s.name for s in charts[0].series] == ["weights int8", "weights bf16"]  # one colour per weight config, in score order
    assert charts[0].series[0].x == (klds[(64, "int8", "int4")],) and charts[0].series[1].y == (0.75,)


def test_report_files_with_and_without_task_scores(tmp_path):
    grid = demo_like_grid()
    data = build_report_data(grid, source="s")
    plain = render_report(data)
    assert "tasks.csv" not in plain and b"downstream-tasks" not in plain["index.html"]
    files = render_report(data, tasks=[_score("int8", "int4", 0.625), _score("int4-g128", "int4", 0.375)])
    assert set(files) - set(plain) == {"tasks.csv", "task0-facts.png"}
    table = list(csv.DictReader(io.StringIO(files["tasks.csv"].decode())))
    assert [(r["weights"], r["kv"], float(r["value"])) for r in table] == [("int8", "int4", 0.625), ("int4-g128", "int4", 0.375)]
    assert float(table[1]["kld_mean"]) == next(r.kld["mean"] for r in grid if (r.weights, r.kv) == ("int4-g128", "int4"))
    page = files["index.html"].decode()
    assert 'id="downstream-tasks"' in page and 'id="table-tasks"' in page and 'id="task0-facts"' in page
    assert "Downstream tasks" in files["report.md"].decode()
    assert [t["value"] for t in json.loads(files["report.json"])["tasks"]] == [0.625, 0.375]


def test_report_from_a_store_reads_its_task_scores(tmp_path):
    db = tmp_path / "results.db"
    with open_store(db) as store:
        for i, result in enumerate(demo_like_grid()):
            store.put(f"id{i}", {"score": "all"}, result)
        store.put_task_scores({"c": 1}, [_score("int8", "int8", 0.5, cid="c1")])
    report = report_from_store(db, tmp_path / "rep")
    assert (tmp_path / "rep" / "tasks.csv").read_text().count("\n") == 2
    assert "tasks.csv" in {p.name for p in report.files}
