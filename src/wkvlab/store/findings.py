"""The findings' analyses in the results store: the ``findings`` table (schema v3).

A finding (``wkvlab findings NAME``) is measured into the store's results and then analysed; the
analysis — rows with their intervals, and the Markdown the command printed — is kept here, one row
per (finding, model), replaced when the finding runs again. ``wkvlab report`` reads it back to show
each finding's section (:mod:`wkvlab.report.findings`).
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredFinding:
    name: str
    model: str
    created_at: float
    seconds: float | None
    data: dict
    markdown: str


def put_finding(conn: sqlite3.Connection, name: str, model: str, seconds: float | None, data: dict, markdown: str) -> None:
    """Write (or replace) one finding's analysis in one statement."""
    conn.execute("INSERT OR REPLACE INTO findings (name, model, created_at, seconds, data, markdown) VALUES (?, ?, ?, ?, ?, ?)",
                 (name, model, time.time(), seconds, json.dumps(data, sort_keys=True, allow_nan=True), markdown))


def read_findings(conn: sqlite3.Connection) -> list[StoredFinding]:
    """Every stored finding, in the order of the findings' list, then by model."""
    from wkvlab.findings import FINDINGS

    rows = [StoredFinding(n, m, c, s, json.loads(d), md) for n, m, c, s, d, md in
            conn.execute("SELECT name, model, created_at, seconds, data, markdown FROM findings")]
    order = {n: i for i, n in enumerate(FINDINGS)}
    return sorted(rows, key=lambda f: (order.get(f.name, len(order)), f.model))
