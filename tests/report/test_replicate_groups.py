"""wkvlab report on a store holding a grid and its replicate (findings --replicates): the replicate is a group of its
own, headed as one, and every paired number stays inside one run."""
from __future__ import annotations

import json

import pytest

from tests.report.helpers import demo_like_grid, make_result
from tests.report.test_tasks_section import _score
from wkvlab.report import report_from_store
from wkvlab.report.data import build_report_data
from wkvlab.store import open_store


def replicate_grid() -> list:
    """The demo grid measured again: other KLDs, and another interaction (0.006 instead of 0.003)."""
    w = {"bf16": 0.0012, "int8": 0.005, "int4-g128": 0.028}
    c = {"fp16": 0.0, "fp8_e4m3": 0.0025, "int8": 0.001, "int4": 0.012}
    return [make_result(wn, cn, wk + ck + (0.006 if (wn, cn) == ("int4-g128", "int4") else 0.0)) for wn, wk in w.items() for cn, ck in c.items()]


def test_a_replicate_is_its_own_group_and_pairs_only_with_its_own_run(tmp_path):
    first, again = demo_like_grid(), replicate_grid()
    db = tmp_path / "findings.db"
    with open_store(db) as store:
        for i, result in enumerate(first):
            store.put(f"r0-{i}", {"score": "all"}, result)  # written before replicates: no replicate entry
        for i, result in enumerate(again):
            store.put(f"r1-{i}", {"score": "all", "replicate": 1, "chunk": 32}, result)
        store.put_task_scores({"c": 1}, [_score("int4-g128", "int4", 0.5, cid="c1")])
    report = report_from_store(db, tmp_path / "rep")
    data = report.data
    assert [g.label for g in data.groups] == ["tiny · default · ctx 64 · 512 tokens",
                                             "tiny · default · ctx 64 · 512 tokens (replicate 1, chunk 32)"]
    assert [len(g.results) for g in data.groups] == [12, 12]
    alone = {0: build_report_data(first, source="r0"), 1: build_report_data(again, source="r1")}
    for g in (0, 1):  # each group's penalties and cross terms are its run's alone: no replicate 1 cell against a replicate 0 baseline
        assert [(r.weights, r.kv, r.penalty.estimate) for r in data.in_group(data.penalties, g)] == \
               [(r.weights, r.kv, r.penalty.estimate) for r in alone[g].penalties]
        assert [(r.weights, r.kv, r.interaction.estimate) for r in data.in_group(data.cross_terms, g)] == \
               [(r.weights, r.kv, r.interaction.estimate) for r in alone[g].cross_terms]
    both = {(r.group, r.weights, r.kv): r.interaction.estimate for r in data.cross_terms}
    assert both[(0, "int4-g128", "int4")] == pytest.approx(0.003, abs=1e-12)
    assert both[(1, "int4-g128", "int4")] == pytest.approx(0.006, abs=1e-12)
    assert "- group 1: tiny · default · ctx 64 · 512 tokens (replicate 1, chunk 32)" in (tmp_path / "rep" / "report.md").read_text()
    assert [g["replicate"] for g in json.loads((tmp_path / "rep" / "report.json").read_text())["groups"]] == [0, 1]
    # a task score joins its config's KLD in each run, each under its run's heading
    tasks = json.loads((tmp_path / "rep" / "report.json").read_text())["tasks"]
    assert [(t["group_label"], t["kld_mean"]) for t in tasks] == [
        ("tiny · default · ctx 64 · 512 tokens", pytest.approx(0.043)),
        ("tiny · default · ctx 64 · 512 tokens (replicate 1, chunk 32)", pytest.approx(0.046))]
