"""The results store's schema, its version, and how an existing file is recognised and migrated.

A wkvlab store is an SQLite file whose header carries ``application_id`` = ``0x574B564C``
("WKVL") and ``user_version`` = the schema version. Opening a file therefore has four outcomes:

* no file, or an empty SQLite database with no tables and no application id → create the schema;
* wkvlab's id and an older version → run the migrations in order, in one transaction;
* wkvlab's id and a newer version → refuse (this wkvlab cannot know what the newer one stores);
* anything else (not SQLite, another program's database, a corrupt file) → refuse.

Refusing is the point: ``--store`` is easy to mistype, and writing our tables into someone's
database, or "repairing" a corrupt store by starting a new one over it, loses data.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from wkvlab.errors import ConfigError, DataError

APPLICATION_ID = 0x574B564C  # "WKVL"
SQLITE_MAGIC = b"SQLite format 3\x00"

# MIGRATIONS[v] turns a version-v store into version v + 1. Version 0 is "no schema yet".
# Never edit a released step; append a new one and bump SCHEMA_VERSION (len(MIGRATIONS)).
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE results (
            config_id TEXT PRIMARY KEY,      -- sha256 of the canonical config JSON (see wkvlab.sweep.plan)
            created_at REAL NOT NULL,        -- unix time of the write
            model TEXT NOT NULL, data TEXT NOT NULL, ctx INTEGER NOT NULL, tokens INTEGER NOT NULL,
            score TEXT NOT NULL, weights TEXT NOT NULL, kv TEXT NOT NULL,
            model_sha256 TEXT, data_sha256 TEXT,
            kld_mean REAL, kld_se REAL, top1 REAL, ppl REAL, ppl_ref REAL,
            weight_bytes INTEGER, kv_bytes_per_token REAL, seconds REAL,
            config TEXT NOT NULL,            -- JSON: everything that determines the numbers
            result TEXT NOT NULL             -- JSON: EvalResult fields except the arrays (versions, notes, ...)
        )""",
        """CREATE TABLE arrays (
            config_id TEXT NOT NULL REFERENCES results(config_id) ON DELETE CASCADE,
            name TEXT NOT NULL,              -- a TokenArrays field: kld, nll_ref, nll, top1_agree, delta_p, position, window
            meta TEXT NOT NULL,              -- JSON: original dtype, stored dtype, shape
            data BLOB NOT NULL,              -- little-endian raw bytes
            PRIMARY KEY (config_id, name)
        )""",
        "CREATE INDEX results_by_group ON results (model_sha256, data_sha256, ctx, tokens)",
    ),
    (
        # v2: downstream-task scores from lm-evaluation-harness ('wkvlab tasks', wkvlab.store.tasks), one row
        # per config × task × metric; a v1 store gains the empty table and keeps every result.
        """CREATE TABLE task_scores (
            task_config_id TEXT NOT NULL,    -- sha256 of the canonical run config (model, weights, kv, tasks, limit, fewshot, lm-eval version)
            task TEXT NOT NULL,              -- lm-eval task name
            metric TEXT NOT NULL,            -- lm-eval metric key with its filter, e.g. 'acc,none'
            created_at REAL NOT NULL,
            model TEXT NOT NULL, model_sha256 TEXT, weights TEXT NOT NULL, kv TEXT NOT NULL,
            value REAL, stderr REAL, samples INTEGER,
            config TEXT NOT NULL,            -- JSON: the run config the id hashes
            PRIMARY KEY (task_config_id, task, metric)
        )""",
        "CREATE INDEX task_scores_by_config ON task_scores (model_sha256, weights, kv)",
    ),
    (
        # v3: the findings' analyses ('wkvlab findings', wkvlab.store.findings), the latest per finding and
        # model, so 'wkvlab report' can show them; the per-token arrays they read stay in results/arrays.
        """CREATE TABLE findings (
            name TEXT NOT NULL,              -- additivity, methods, calibration, depth, search, engine
            model TEXT NOT NULL,             -- the --model given
            created_at REAL NOT NULL,
            seconds REAL,                    -- wall time of the run that wrote it (measuring and analysing)
            data TEXT NOT NULL,              -- JSON: the finding's rows with their intervals
            markdown TEXT NOT NULL,          -- the tables as 'wkvlab findings' printed them
            PRIMARY KEY (name, model)
        )""",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


def refuse_foreign(path: Path, why: str) -> DataError:
    return DataError(f"{path} is not a wkvlab results store ({why}); wkvlab will not write into it — pass a new file name to --store")


def check_file(path: Path, create: bool) -> None:
    """Cheap checks before SQLite touches the file: a folder, a missing store, a non-SQLite header."""
    if path.is_dir():
        raise ConfigError(f"--store {path} is a folder; give a file name such as {path / 'results.db'}")
    if not path.exists():
        if not create:
            raise DataError(f"no results store at {path}; run 'wkvlab sweep <spec.yaml> --store {path}' first")
        if not path.parent.exists():
            raise ConfigError(f"folder {path.parent} does not exist; create it or choose another --store path")
        return
    with path.open("rb") as handle:
        head = handle.read(len(SQLITE_MAGIC))
    if head and head != SQLITE_MAGIC:  # an empty file is a new database to SQLite, and holds nothing to lose
        raise refuse_foreign(path, "not an SQLite file")


def identify(conn: sqlite3.Connection, path: Path) -> tuple[int, int, int]:
    """(application_id, user_version, number of tables); a corrupt file raises DataError."""
    # One read transaction, so the three values are one snapshot: read one by one, they could
    # straddle another process's schema creation (id 0 but tables present: "foreign").
    own = not conn.in_transaction
    try:
        if own:
            conn.execute("BEGIN")
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            if own and conn.in_transaction:
                conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise DataError(f"{path} is corrupt or not a database ({exc}); restore it from a backup or pass a new file to --store") from None
    return app_id, version, tables


def _refuse_unless_usable(path: Path, app_id: int, version: int, tables: int, create: bool) -> bool:
    """True when the file is a current store; raises when it can never be one; False: to be created or migrated."""
    if app_id == APPLICATION_ID and version == SCHEMA_VERSION:
        return True
    if app_id == 0 and tables == 0 and not create:
        raise DataError(f"{path} is an empty database, not a results store; run 'wkvlab sweep <spec.yaml> --store {path}' first")
    _check_ours(path, app_id, version, tables)
    return False


def check_store(path: Path, create: bool) -> None:
    """Everything :func:`open_store <wkvlab.store.db.open_store>` would refuse, read-only and without
    numpy or torch: the CLI calls it before long work."""
    check_file(path, create)
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DataError(f"cannot open results store {path} ({exc}); check the path and its permissions") from None
    try:
        _refuse_unless_usable(path, *identify(conn, path), create)
    finally:
        conn.close()


def ensure_schema(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    """Create or migrate the schema, or refuse the file. ``conn`` is in autocommit mode."""
    if _refuse_unless_usable(path, *identify(conn, path), create):
        return
    # EXCLUSIVE: two sweeps creating the same new store must not both run the migrations.
    conn.execute("BEGIN EXCLUSIVE")
    try:
        app_id, version, tables = identify(conn, path)  # again, under the lock: the other one may have won
        _check_ours(path, app_id, version, tables)
        for step in MIGRATIONS[version:]:
            for statement in step:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _check_ours(path: Path, app_id: int, version: int, tables: int) -> None:
    if app_id == 0 and tables:
        raise refuse_foreign(path, f"an SQLite database of another program with {tables} schema objects")
    if app_id not in (0, APPLICATION_ID):
        raise refuse_foreign(path, f"SQLite application_id {app_id:#x}, wkvlab's is {APPLICATION_ID:#x}")
    if version > SCHEMA_VERSION:
        raise DataError(f"{path} was written by a newer wkvlab (store schema v{version}, this one knows v{SCHEMA_VERSION}); upgrade wkvlab to read it")
