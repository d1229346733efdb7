"""Downstream-task scores in the results store: the ``task_scores`` table (schema v2).

One row per configuration × task × metric, keyed by a run id that hashes everything that
determines the scores (model file, weights and KV specs, the tasks and their options, lm-eval's
version). A config's rows are written in one transaction, so a killed ``wkvlab tasks`` leaves each
config either fully scored or absent, and the next run scores only what is absent. Rows join the
KLD results on (model_sha256, weights label, KV label): :mod:`wkvlab.report.tasks` puts them side by side.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class TaskScore:
    """One metric of one lm-eval task for one weights × KV config."""

    task_config_id: str
    task: str
    metric: str  # lm-eval's key with its filter, e.g. 'acc,none'
    model: str
    model_sha256: str | None
    weights: str
    kv: str
    value: float
    stderr: float | None
    samples: int | None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_COLUMNS = "task_config_id, task, metric, model, model_sha256, weights, kv, value, stderr, samples"


def put_scores(conn: sqlite3.Connection, config: dict, scores: list[TaskScore]) -> bool:
    """Write one config's scores in one transaction; False when its id was already stored (kept as it was)."""
    if not scores:
        return False
    ids = {s.task_config_id for s in scores}
    if len(ids) != 1:
        raise ValueError("put_scores writes the scores of one task config at a time")
    now, text = time.time(), json.dumps(config, sort_keys=True)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("SELECT 1 FROM task_scores WHERE task_config_id = ? LIMIT 1", (next(iter(ids)),)).fetchone():
            conn.execute("COMMIT")
            return False
        conn.executemany(f"INSERT INTO task_scores ({_COLUMNS}, created_at, config) VALUES ({', '.join('?' * 12)})",
                         [(*(getattr(s, f.name) for f in fields(TaskScore)), now, text) for s in scores])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return True


def scored_ids(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT DISTINCT task_config_id FROM task_scores")}


def read_scores(conn: sqlite3.Connection) -> list[TaskScore]:
    """Every stored score, in the order written."""
    return [TaskScore(*r) for r in conn.execute(f"SELECT {_COLUMNS} FROM task_scores ORDER BY created_at, rowid")]
