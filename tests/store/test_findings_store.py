"""Schema v3: the findings' analyses next to the results; a v2 store is migrated and keeps everything."""
import math
import sqlite3

from tests.store.helpers import fake_result
from tests.store.test_store import assert_same_result
from wkvlab.store import SCHEMA_VERSION, open_store, schema


def test_v2_store_gains_the_findings_table_keeping_results(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])  # a store written by the v2 wkvlab
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    with open_store(path) as store:
        store.put("x", {"score": "all"}, fake_result(3))
    monkeypatch.undo()
    conn = sqlite3.connect(path)
    assert "findings" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    with open_store(path, create=False) as store:
        assert_same_result(store.get("x"), fake_result(3))
        assert store.findings() == []
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3


def test_a_finding_round_trips_and_a_rerun_replaces_it(tmp_path):
    with open_store(tmp_path / "r.db") as store:
        store.put_finding("depth", "gemma3-270m", 12.5, {"tables": [{"growth": None, "x": float("nan")}]}, "| a |")
        store.put_finding("additivity", "default", 3.0, {"rows": [1]}, "| b |")
        store.put_finding("depth", "gemma3-270m", 20.0, {"tables": []}, "| c |")
        found = store.findings()
    assert [(f.name, f.model, f.seconds, f.markdown) for f in found] == [("additivity", "default", 3.0, "| b |"),
                                                                       ("depth", "gemma3-270m", 20.0, "| c |")]
    assert found[1].data == {"tables": []}


def test_nan_in_a_finding_survives_the_json(tmp_path):
    with open_store(tmp_path / "r.db") as store:
        store.put_finding("search", "default", None, {"rho": float("nan")}, "")
        (f,) = store.findings()
    assert math.isnan(f.data["rho"]) and f.seconds is None
