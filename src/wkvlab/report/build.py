"""Results → a report folder: the page, PNGs, Markdown, CSVs and the data as JSON.

Everything is rendered in memory first and written only when all of it succeeded, so a failing
chart never leaves half a report behind.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from wkvlab.eval.result import EvalResult
from wkvlab.report.charts import group_charts, sensitivity_heatmap
from wkvlab.report.data import ReportData, build_report_data
from wkvlab.report.findings import finding_sections
from wkvlab.report.html import render_page, script_json
from wkvlab.report.output import write_folder
from wkvlab.report.png import render_png
from wkvlab.report.profiles import Profile
from wkvlab.report.tables import markdown_document, report_tables, to_csv
from wkvlab.report.tasks import task_charts, task_rows, tasks_table
from wkvlab.store import ResultStore, open_store
from wkvlab.store.findings import StoredFinding
from wkvlab.store.tasks import TaskScore


@dataclass(frozen=True)
class ReportFiles:
    folder: Path
    files: tuple[Path, ...]
    data: ReportData

    @property
    def page(self) -> Path:
        return self.folder / "index.html"


def render_report(data: ReportData, profiles: Sequence[Profile] = (), tasks: Sequence[TaskScore] = (),
                  findings: Sequence[StoredFinding] = ()) -> dict[str, bytes]:
    """Every file of the report, by name; ``tasks``: downstream-task scores to put next to KLD (wkvlab tasks);
    ``findings``: the findings' analyses (wkvlab findings), one section each."""
    charts = {g.index: group_charts(data, g.index) for g in data.groups}
    heatmaps = [sensitivity_heatmap(p, i) for i, p in enumerate(profiles)]
    tables = report_tables(data)
    rows = task_rows(data.groups, tasks)
    per_task = task_charts(rows)
    if rows:
        tables.append(tasks_table(rows))
    sections = finding_sections(findings)
    tables += [s.table for s in sections]
    payload = {**data.to_dict(), "profiles": [p.to_dict() for p in profiles], **({"tasks": [r.to_dict() for r in rows]} if rows else {}),
               **({"findings": [{"name": f.name, "model": f.model, "seconds": f.seconds, "data": f.data} for f in findings]} if findings else {})}
    files = {"index.html": render_page(data, charts, heatmaps, tables, task_charts=per_task, findings=sections).encode("utf-8"),
             "report.md": markdown_document(data, tables).encode("utf-8"),
             "report.json": script_json(payload).encode("utf-8")}
    files.update({f"{t.name}.csv": to_csv(t).encode("utf-8") for t in tables})
    files.update({f"{c.id}.png": render_png(c) for cs in charts.values() for c in cs})
    files.update({f"{h.id}.png": render_png(h) for h in heatmaps})
    files.update({f"{c.id}.png": render_png(c) for c in per_task})
    files.update({f"{c.id}.png": render_png(c) for s in sections for c in s.charts})
    return files


def write_report(results: Sequence[EvalResult], out: str | Path, *, source: str, context: int = 8192, batch: int = 1,
                 profiles: Sequence[Profile] = (), tasks: Sequence[TaskScore] = (),
                 findings: Sequence[StoredFinding] = (), replicates: Sequence[tuple[int, int]] = ()) -> ReportFiles:
    """Build the report of ``results`` into folder ``out`` (created; a foreign non-empty folder is refused);
    ``replicates``: each result's (replicate, chunk) (a replicate is drawn as a group of its own)."""
    data = build_report_data(results, source=source, context=context, batch=batch, replicates=replicates)
    written = write_folder(Path(out), render_report(data, profiles, tasks, findings))
    return ReportFiles(Path(out), tuple(written), data)


def report_from_store(store: str | Path, out: str | Path, *, context: int = 8192, batch: int = 1,
                      profiles: Sequence[Profile] = ()) -> ReportFiles:
    """The report of every result in a results store (opened read-only: a missing store is an error)."""
    with open_store(store, create=False) as db:
        results, replicates = stored_results(db)
        tasks = db.task_scores()
        findings = db.findings()
    return write_report(results, out, source=str(store), context=context, batch=batch, profiles=profiles, tasks=tasks,
                        findings=findings, replicates=replicates)


def stored_results(db: ResultStore) -> tuple[list[EvalResult], list[tuple[int, int]]]:
    """Every result of a store, and each one's (replicate, chunk): what :func:`~wkvlab.report.data.group_results` groups by."""
    rows = db.rows()
    return db.results([r.config_id for r in rows]), [(r.replicate, r.chunk) for r in rows]
