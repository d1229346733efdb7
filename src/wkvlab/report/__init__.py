"""The HTML report (plotly.js inline, offline), PNGs (matplotlib) and Markdown/CSV tables of stored results.

See docs/report.md. ``data`` computes, ``charts`` and ``tables`` describe, ``html``/``png`` render,
``output`` writes the folder, ``build`` ties them together.
"""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("build", "ReportFiles", "render_report", "report_from_store", "write_report"),
    **names("output", "check_folder"),
    **names("profiles", "Profile", "load_profile"),
}
__all__ = ["ReportFiles", "render_report", "report_from_store", "write_report", "check_folder", "Profile", "load_profile"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
