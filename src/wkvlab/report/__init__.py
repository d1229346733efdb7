"""The HTML report (plotly.js inline, offline), PNGs (matplotlib) and Markdown/CSV tables of stored results.

See docs/report.md. ``data`` computes, ``charts`` and ``tables`` describe, ``html``/``png`` render,
``output`` writes the folder, ``build`` ties them together.
"""
from wkvlab.report.build import ReportFiles, render_report, report_from_store, write_report
from wkvlab.report.output import check_folder
from wkvlab.report.profiles import Profile, load_profile

__all__ = ["ReportFiles", "render_report", "report_from_store", "write_report", "check_folder", "Profile", "load_profile"]
