"""``wkvlab report``: a thin command over :func:`wkvlab.report.report_from_store`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wkvlab.display import console, err_console
from wkvlab.report.build import ReportFiles, report_from_store
from wkvlab.report.profiles import load_profile


def print_written(report: ReportFiles) -> None:
    err_console.print(f"wrote {len(report.files)} files to {report.folder}: open {report.page} in a browser")


def report_command(
    store: Annotated[Path, typer.Option(help="results store written by 'wkvlab sweep'")] = Path("results.db"),
    out: Annotated[Path, typer.Option(help="report folder (created; a non-empty folder that is not a wkvlab report is refused)")] = Path("report"),
    context: Annotated[int, typer.Option(help="context length (tokens) at which the KV cache counts toward memory")] = 8192,
    batch: Annotated[int, typer.Option(help="sequences whose KV cache counts toward memory")] = 1,
    profile: Annotated[Optional[list[Path]], typer.Option(help="per-layer sensitivity JSON from 'wkvlab profile' (repeatable)")] = None,
) -> None:
    """Write an offline HTML report (interactive charts), PNGs, Markdown and CSV tables of a results store."""
    profiles = [load_profile(p) for p in profile or []]
    with console.status(f"building the report of {store}"):
        report = report_from_store(store, out, context=context, batch=batch, profiles=profiles)
    print_written(report)
