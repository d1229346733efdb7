"""``wkvlab report``: a thin command over :func:`wkvlab.report.report_from_store`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from wkvlab.display import err_console, status
from wkvlab.preflight import require_store
from wkvlab.report.output import check_folder

if TYPE_CHECKING:
    from wkvlab.report.build import ReportFiles


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
    from wkvlab.report.profiles import load_profile

    require_store(store)
    check_folder(out)
    profiles = [load_profile(p) for p in profile or []]
    from wkvlab.report.build import report_from_store

    with status(f"building the report of {store}"):
        report = report_from_store(store, out, context=context, batch=batch, profiles=profiles)
    print_written(report)
