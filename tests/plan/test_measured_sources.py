"""--results (wkvlab eval --json) and --store (a sweep's SQLite store) feed the plan's quality column."""
from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.kv.spec import KVSpec
from wkvlab.plan import load_measurements, plan
from wkvlab.plan.cli import plan_command
from wkvlab.weights.spec import WeightSpec

def result(model: str, weights: str, kv: str, kld: float, n: int = 600) -> EvalResult:
    ctx = 64
    windows = n // (ctx - 1)
    n = windows * (ctx - 1)
    arrays = TokenArrays(kld=np.full(n, kld), nll_ref=np.full(n, 2.0), nll=np.full(n, 2.0), top1_agree=np.ones(n, bool),
                         delta_p=np.zeros(n), position=np.tile(np.arange(ctx - 1), windows), window=np.repeat(np.arange(windows), ctx - 1))
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    return EvalResult(model=model, data="default", ctx=ctx, weights=w.label, kv=k.label, weights_spec=w.to_dict(), kv_spec=k.to_dict(),
                      weight_bytes=1, kv_bytes_per_token=1.0, seconds=0.1, arrays=arrays, buckets=position_buckets(ctx))


def test_results_file_ranks_by_measured_kld(model_dir, tmp_path):
    path = tmp_path / "out.json"
    path.write_text(json.dumps([result("tinyplan", "int8", "int4", 0.02).to_dict(), result("tinyplan", "int8", "fp8_e4m3", 0.005).to_dict(),
                                result("other-model", "bf16", "int8", 0.0001).to_dict()]))
    planned = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=load_measurements([path]))
    ranked = [r for r in planned.rows if r.rank]
    # the checkpoint itself fits (memory is not the constraint): it ranks first, then the measured rows by KLD
    assert [(r.weights, r.kv) for r in ranked[:3]] == [("bf16", "bf16"), ("int8", "fp8_e4m3"), ("int8", "int4")]
    assert ranked[1].quality.label == "measured (567 tokens, ctx 64, default)" and ranked[1].quality.kld == pytest.approx(0.005)
    assert all(not r.quality.is_measured and not r.recommendable for r in ranked[3:])
    assert any("other-model" in n for n in planned.notes)
    assert (planned.recommendations[0].weights, planned.recommendations[0].kv) == ("bf16", "bf16")
    # without the 16-bit row in the grid, the measured ones decide (room to spare: the most faithful first)
    only = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", weights=["int8"], kv=["int4", "fp8_e4m3"],
                measurements=load_measurements([path]))
    rec = only.recommendations[0]
    assert (rec.weights, rec.kv) == ("int8", "fp8_e4m3") and rec.verified and any("most faithful measured config" in w for w in rec.why)


def test_store_gives_the_same_measurements(model_dir, tmp_path):
    from wkvlab.store import open_store

    db = tmp_path / "results.db"
    with open_store(db) as store:
        for i, (w, k, kld) in enumerate([("int8", "int4", 0.02), ("int8", "fp8_e4m3", 0.005)]):
            r = result("tinyplan", w, k, kld)
            store.put(f"id{i}", {"weights": r.weights_spec, "kv": r.kv_spec, "score": "all"}, r)
    from_store = load_measurements(stores=[db])
    assert {(m.weights, m.kv, round(m.kld, 6)) for m in from_store} == {("int8", "int4", 0.02), ("int8", "fp8_e4m3", 0.005)}
    planned = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=from_store)
    assert [(r.weights, r.kv) for r in planned.rows if r.rank][:3] == [("bf16", "bf16"), ("int8", "fp8_e4m3"), ("int8", "int4")]


def test_cli_results_and_store_options(model_dir, tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(result("tinyplan", "int8", "int4", 0.02).to_dict()))  # a single result, not a list
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.callback()(lambda: None)
    out = CliRunner().invoke(app, ["plan", "-m", str(model_dir), "-g", "RTX-4090", "-b", "4", "--context", "1024", "-e", "vllm",
                                   "--results", str(path)])
    assert out.exit_code == 0, out.output
    assert "measured (567 tokens, ctx 64, default)" in out.output and "rank first, by measured KLD" in out.output
