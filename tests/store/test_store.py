"""The results store: exact round trips, one transaction per result, refusing files that are not ours."""
from __future__ import annotations

import sqlite3
from dataclasses import fields

import numpy as np
import pytest

from tests.store.helpers import fake_result
from wkvlab.errors import ConfigError, DataError
from wkvlab.eval.result import TokenArrays
from wkvlab.store import APPLICATION_ID, SCHEMA_VERSION, open_store
from wkvlab.store import schema
from wkvlab.store.arrays import decode_array, encode_array


def assert_same_result(a, b):
    for f in fields(TokenArrays):
        x, y = getattr(a.arrays, f.name), getattr(b.arrays, f.name)
        if x is None or y is None:  # an optional array (document): absent on both sides
            assert x is None and y is None, f.name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
    assert a.to_dict() == b.to_dict()


def test_result_round_trips_exactly(tmp_path):
    result = fake_result(1)
    with open_store(tmp_path / "r.db") as store:
        assert store.put("abc", {"score": "all", "ctx": 64}, result)
        back = store.get("abc")
        assert store.config("abc") == {"score": "all", "ctx": 64}
        assert store.done(["abc", "nope"]) == {"abc"}
    assert_same_result(result, back)
    assert back.buckets == result.buckets and back.versions == result.versions


def test_documents_round_trip_and_old_results_read_as_one_stream(tmp_path):
    with_docs, stream = fake_result(1, windows=4, documents=[0, 0, 2, 5]), fake_result(2)
    with open_store(tmp_path / "r.db") as store:
        store.put("docs", {}, with_docs), store.put("stream", {}, stream)
        back, old = store.get("docs"), store.get("stream")
        rows = {name for (name,) in store._conn.execute("SELECT name FROM arrays WHERE config_id = 'stream'")}
    assert_same_result(with_docs, back)
    assert back.arrays.units.kind == "documents" and np.unique(back.arrays.units.labels).tolist() == [0, 2, 5]
    # no document row (what every store written before documents holds): windows are the units
    assert "document" not in rows and old.arrays.document is None and old.arrays.units.kind == "windows"


@pytest.mark.parametrize("array", [
    np.array([0.1, np.nan, np.inf, -0.0]),                        # float64 that is not float32-exact stays float64
    np.array([0.5, np.nan, -np.inf], dtype=np.float64),           # float32-exact, NaN included: stored narrow
    np.array([0, 2**40], dtype=np.int64),                          # out of int32 range: stays int64
    np.array([True, False]), np.zeros((2, 3), dtype=np.float32), np.array([], dtype=np.float64),
])
def test_arrays_round_trip_bits_and_dtype(array):
    meta, blob = encode_array(array)
    back = decode_array(meta, blob)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()


def test_exact_float32_values_take_half_the_room():
    meta, blob = encode_array(np.arange(10, dtype=np.float64) / 4)
    assert len(blob) == 40 and '"stored": "<f4"' in meta


def test_duplicate_id_keeps_the_first(tmp_path):
    with open_store(tmp_path / "r.db") as store:
        assert store.put("x", {}, fake_result(1))
        assert not store.put("x", {}, fake_result(2))
        assert store.get("x").weight_bytes == 1001 and len(store) == 1


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    with open_store(tmp_path / "r.db") as store:
        result = fake_result(1)
        monkeypatch.setattr(result, "arrays", None)  # encoding fails before the transaction; no row
        with pytest.raises(AttributeError):
            store.put("x", {}, result)
        assert len(store) == 0
        # a failure inside the transaction (after the row, before the arrays) rolls the row back
        conn = store._conn
        store._conn = _FailingArrays(conn)
        with pytest.raises(RuntimeError):
            store.put("y", {}, fake_result(2))
        store._conn = conn
        assert len(store) == 0 and conn.execute("SELECT count(*) FROM arrays").fetchone()[0] == 0


class _FailingArrays:
    def __init__(self, conn):
        self._conn = conn

    def execute(self, *a):
        return self._conn.execute(*a)

    def executemany(self, *a):
        raise RuntimeError("killed between the row and its arrays")


def test_store_file_is_wal_and_tagged(tmp_path):
    path = tmp_path / "r.db"
    open_store(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_non_sqlite_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("my precious notes\n" * 100)
    before = path.read_bytes()
    with pytest.raises(DataError, match="not an SQLite file"):
        open_store(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.execute("INSERT INTO people VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DataError, match="another program"):
        open_store(path)
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.close()
    with pytest.raises(DataError, match="application_id"):
        open_store(path)


def test_corrupt_store_is_refused(tmp_path):
    path = tmp_path / "r.db"
    with open_store(path) as store:
        store.put("x", {}, fake_result(1))
    raw = bytearray(path.read_bytes())
    raw[16:100] = b"\xff" * 84  # page size and header fields: SQLite cannot read page 1
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="corrupt|not a wkvlab"):
        open_store(path)


def test_missing_store_is_not_created_for_reading(tmp_path):
    with pytest.raises(DataError, match="no results store"):
        open_store(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()
    with pytest.raises(ConfigError, match="is a folder"):
        open_store(tmp_path)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "r.db"
    open_store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(DataError, match="newer wkvlab"):
        open_store(path)


def test_older_schema_is_migrated_keeping_results(tmp_path, monkeypatch):
    path = tmp_path / "r.db"
    with open_store(path) as store:
        store.put("x", {}, fake_result(1))
    step = ("ALTER TABLE results ADD COLUMN comment TEXT",)
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, step])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", len(schema.MIGRATIONS))
    with open_store(path) as store:
        assert_same_result(store.get("x"), fake_result(1))
        assert "comment" in [r[1] for r in store._conn.execute("PRAGMA table_info(results)")]
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
