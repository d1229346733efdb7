"""wkvlab eval --store writes its results under the ids a sweep of the same configs gives them."""
import pytest

from wkvlab import api
from wkvlab.store import open_store
from wkvlab.sweep.run import plan_sweep
from wkvlab.sweep.spec import SweepSpec


@pytest.mark.slow
def test_eval_results_count_as_done_for_the_same_sweep(default_model, tmp_path):
    work = api.prepare(default_model, "default", ctx=64, tokens=130)
    weights, kv = api.parse_weights(["none", "int8"]), api.parse_kv(["fp16", "q4_0"])
    results = api.evaluate_workload(work, weights, kv)
    store = tmp_path / "r.db"
    assert api.store_results(results, store, work=work, weights=weights, kv=kv) == 4
    assert api.store_results(results, store, work=work, weights=weights, kv=kv) == 0  # already there
    spec = SweepSpec(models=("default",), ctx=(64,), tokens=(130,), weights=tuple(weights), kv=tuple(kv + api.parse_kv(["int8"])), device="cpu")
    with open_store(store) as db:
        plan = plan_sweep(spec, db)
        assert len(plan.done) == 4 and len(plan.missing) == 2  # only int8 KV is new
        stored = db.get(sorted(plan.done)[0])
        assert stored.arrays.kld.size == results[0].arrays.kld.size


def test_a_store_that_became_unwritable_mid_run_costs_neither_the_json_nor_the_table(default_model, tmp_path, monkeypatch):
    # a newer wkvlab migrated the store while this one evaluated (it happened: an hour of Gemma at 32k lost)
    import json

    from typer.testing import CliRunner

    from wkvlab.cli import app
    from wkvlab.errors import DataError

    def newer_store(*_a, **_k):
        raise DataError(f"{tmp_path / 'r.db'} was written by a newer wkvlab (store schema v9, this one knows v3); upgrade wkvlab to read it")

    monkeypatch.setattr(api, "store_results", newer_store)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["eval", "--ctx", "64", "--tokens", "64", "--kv", "q4_0", "--threads", "1", "--json", str(out),
                                      "--store", str(tmp_path / "r.db")])
    # raised after everything else was written; the entry point prints it as its one line (tests/test_cli_fuzz.py)
    assert isinstance(result.exception, DataError) and "newer wkvlab" in str(result.exception)
    assert "q4_0" in result.output  # the table was printed
    assert json.loads(out.read_text())["kv"] == "q4_0"
