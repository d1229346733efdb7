"""Schema v2: downstream-task scores next to results; a v1 store is migrated and keeps its results."""
import sqlite3

import pytest

from tests.store.helpers import fake_result
from tests.store.test_store import assert_same_result
from wkvlab.store import SCHEMA_VERSION, open_store, schema
from wkvlab.store.tasks import TaskScore


def _score(cid="c1", task="t", metric="acc,none", value=0.5, weights="int8", kv="q4_0"):
    return TaskScore(cid, task, metric, "smollm2", "m" * 64, weights, kv, value, 0.1, 8)


def test_v1_store_is_migrated_to_task_scores_keeping_its_results(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])  # a store written by the v1 wkvlab
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 1)
    with open_store(path) as store:
        store.put("x", {"score": "all"}, fake_result(3))
    monkeypatch.undo()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert "task_scores" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    with open_store(path, create=False) as store:  # reading is enough to migrate
        assert_same_result(store.get("x"), fake_result(3))
        assert store.task_scores() == [] and store.task_config_ids() == set()
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3


def test_task_scores_round_trip_and_a_config_is_written_once(tmp_path):
    with open_store(tmp_path / "r.db") as store:
        rows = [_score(metric="acc,none", value=0.75), _score(metric="acc_norm,none", value=0.5)]
        assert store.put_task_scores({"run": 1}, rows) is True
        assert store.put_task_scores({"run": 1}, [_score(value=0.0)]) is False  # the first write is kept
        assert store.task_scores() == rows and store.task_config_ids() == {"c1"}
        with pytest.raises(ValueError, match="one task config"):
            store.put_task_scores({}, [_score("a"), _score("b")])
        assert store.task_config_ids() == {"c1"}
