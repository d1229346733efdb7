"""The SQLite results store: one file, WAL, one transaction per result.

Why SQLite: one file to copy, transactions that survive ``kill -9`` (a result is either fully
there, row and arrays, or not at all), and concurrent sweeps writing the same file without a
server — WAL lets readers run while one writer commits, and a writer that finds the file locked
waits (``busy_timeout``) instead of failing. WAL needs a local file system (not NFS).

Results are keyed by their config id (a hash of everything that determines the numbers, see
:mod:`wkvlab.sweep.plan`). Writing an id that is already there keeps the first row: two sweeps
that computed the same config computed the same numbers, and the first is never overwritten.
"""
from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Iterator

from wkvlab.errors import DataError
from wkvlab.stats.replicates import replicate_label
from wkvlab.eval.result import EvalResult
from wkvlab.store.arrays import decode_token_arrays, encode_token_arrays
from wkvlab.store.schema import check_file, ensure_schema
from wkvlab.store.findings import StoredFinding, put_finding, read_findings
from wkvlab.store.tasks import TaskScore, put_scores, read_scores, scored_ids

BUSY_TIMEOUT_S = 120  # how long a writer waits for another sweep's transaction before giving up
_RESULT_FIELDS = tuple(f.name for f in fields(EvalResult) if f.name != "arrays")
_SUMMARY = "config_id, created_at, model, data, ctx, tokens, score, weights, kv, kld_mean, kld_se, top1, ppl, ppl_ref, weight_bytes, kv_bytes_per_token, seconds"


@dataclass(frozen=True)
class StoredRow:
    """One stored result's summary columns (no arrays): what listings and plans need."""

    config_id: str
    created_at: float
    model: str
    data: str
    ctx: int
    tokens: int
    score: str
    weights: str
    kv: str
    kld_mean: float
    kld_se: float
    top1: float
    ppl: float
    ppl_ref: float
    weight_bytes: int
    kv_bytes_per_token: float
    seconds: float
    # r >= 1: the config measured again (another calibration sample, chunks halved r times; wkvlab.sweep.plan);
    # from the stored config, not a column: stores written before replicates read as replicate 0
    replicate: int = 0
    chunk: int = 0  # queries per prefill chunk the config ran with (0: automatic)

    @property
    def replicate_label(self) -> str:
        """``" (replicate 1, chunk 256)"`` or ``""``: what tells a replicate's row from the measurement's."""
        return replicate_label(self.replicate, self.chunk)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _run_of(config: dict) -> tuple[int, int]:
    """(replicate, chunk) of a stored config (a :class:`wkvlab.sweep.plan.SweepConfig` dict; other writers' lack both)."""
    return int(config.get("replicate") or 0), int(config.get("chunk") or 0)


def result_fields(result: EvalResult) -> dict:
    """The JSON-able fields of an EvalResult, without its arrays."""
    data = {name: getattr(result, name) for name in _RESULT_FIELDS}
    data["buckets"] = [list(b) for b in result.buckets]
    return data


class ResultStore:
    """A wkvlab results store; use :func:`open_store`. Not shared between threads or processes:
    each process opens its own (SQLite does the locking between them)."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise DataError(f"{self.path} stayed locked by another writer for {BUSY_TIMEOUT_S} s; retry when the other sweep has finished its write") from None
            raise DataError(f"cannot use results store {self.path} ({exc}); check the file and its folder are writable") from None
        except sqlite3.DatabaseError as exc:
            raise DataError(f"{self.path} is corrupt ({exc}); restore it from a backup or pass a new file to --store") from None

    # ---- writing ------------------------------------------------------------------------

    def put(self, config_id: str, config: dict, result: EvalResult) -> bool:
        """Store one result and its arrays in one transaction; False when the id was already there."""
        kld = result.kld
        fp = result.fingerprints
        row = (config_id, time.time(), result.model, result.data, result.ctx, result.tokens, str(config.get("score", "all")),
               result.weights, result.kv, fp.get("model_sha256"), fp.get("data_sha256"), kld["mean"], kld["se"],
               result.top1_agreement, result.ppl, result.ppl_ref, result.weight_bytes, result.kv_bytes_per_token, result.seconds,
               json.dumps(config, sort_keys=True), json.dumps(result_fields(result), sort_keys=True))
        arrays = encode_token_arrays(result.arrays)  # before the transaction: hold the write lock briefly
        with self._errors():
            # IMMEDIATE takes the write lock up front, so the busy timeout applies here and a
            # read-then-write upgrade can never deadlock against another sweep.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._conn.execute(f"INSERT OR IGNORE INTO results VALUES ({', '.join('?' * len(row))})", row)
                inserted = cursor.rowcount == 1
                if inserted:
                    self._conn.executemany("INSERT INTO arrays VALUES (?, ?, ?, ?)", [(config_id, *a) for a in arrays])
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return inserted

    # ---- reading ------------------------------------------------------------------------

    def done(self, config_ids: Iterable[str]) -> set[str]:
        """Which of ``config_ids`` are stored."""
        ids = list(config_ids)
        found: set[str] = set()
        with self._errors():
            for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
                chunk = ids[start : start + 500]
                sql = f"SELECT config_id FROM results WHERE config_id IN ({', '.join('?' * len(chunk))})"
                found.update(r[0] for r in self._conn.execute(sql, chunk))
        return found

    def __len__(self) -> int:
        with self._errors():
            return self._conn.execute("SELECT count(*) FROM results").fetchone()[0]

    def rows(self) -> list[StoredRow]:
        """Summaries of every stored result, in the order they were written."""
        with self._errors():
            found = self._conn.execute(f"SELECT {_SUMMARY}, config FROM results ORDER BY created_at, rowid").fetchall()
        return [StoredRow(*r[:-1], *_run_of(json.loads(r[-1]))) for r in found]

    def config(self, config_id: str) -> dict:
        with self._errors():
            row = self._conn.execute("SELECT config FROM results WHERE config_id = ?", (config_id,)).fetchone()
        if row is None:
            raise DataError(f"no result {config_id} in {self.path}; 'wkvlab results --store {self.path}' lists them")
        return json.loads(row[0])

    def get(self, config_id: str) -> EvalResult:
        """The full result, arrays included, exactly as it was written."""
        with self._errors():
            row = self._conn.execute("SELECT result FROM results WHERE config_id = ?", (config_id,)).fetchone()
            if row is None:
                raise DataError(f"no result {config_id} in {self.path}; 'wkvlab results --store {self.path}' lists them")
            arrays = self._conn.execute("SELECT name, meta, data FROM arrays WHERE config_id = ?", (config_id,)).fetchall()
        data = json.loads(row[0])
        data["buckets"] = [tuple(b) for b in data["buckets"]]
        try:
            token_arrays = decode_token_arrays(arrays)
        except ValueError as exc:
            raise DataError(f"{self.path} holds an incomplete result {config_id} ({exc}); delete that row or restore the file") from None
        return EvalResult(arrays=token_arrays, **data)

    def results(self, config_ids: Iterable[str] | None = None) -> list[EvalResult]:
        ids = [r.config_id for r in self.rows()] if config_ids is None else list(config_ids)
        return [self.get(i) for i in ids]

    # ---- downstream-task scores (schema v2, wkvlab.store.tasks) --------------------------

    def put_task_scores(self, config: dict, scores: list[TaskScore]) -> bool:
        """Store one config's lm-eval scores in one transaction; False when that config was already scored."""
        with self._errors():
            return put_scores(self._conn, config, scores)

    def task_config_ids(self) -> set[str]:
        with self._errors():
            return scored_ids(self._conn)

    def task_scores(self) -> list[TaskScore]:
        """Every stored :class:`wkvlab.store.tasks.TaskScore`, in the order written."""
        with self._errors():
            return read_scores(self._conn)

    # ---- findings' analyses (schema v3, wkvlab.store.findings) -----------------------------

    def put_finding(self, name: str, model: str, seconds: float | None, data: dict, markdown: str) -> None:
        with self._errors():
            put_finding(self._conn, name, model, seconds, data, markdown)

    def findings(self) -> list[StoredFinding]:
        with self._errors():
            return read_findings(self._conn)

    def seconds_per_token(self, model_sha256: str) -> float | None:
        """Median measured seconds per scored token of one config on this model (None if none stored)."""
        with self._errors():
            values = sorted(r[0] for r in self._conn.execute(
                "SELECT seconds / tokens FROM results WHERE model_sha256 = ? AND tokens > 0", (model_sha256,)))
        return values[len(values) // 2] if values else None


def open_store(path: str | Path, *, create: bool = True) -> ResultStore:
    """Open (or, with ``create``, make) a results store; a foreign or corrupt file raises DataError."""
    path = Path(path)
    check_file(path, create)
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise DataError(f"cannot open results store {path} ({exc}); check the path and its permissions") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        ensure_schema(conn, path, create)
        store = ResultStore(path, conn)
        with store._errors():
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")  # persistent: set once, by whoever creates the store
            conn.execute("PRAGMA synchronous = FULL")  # a committed result survives power loss, not only kill -9
            conn.execute("PRAGMA foreign_keys = ON")
        return store
    except BaseException:
        conn.close()
        raise
