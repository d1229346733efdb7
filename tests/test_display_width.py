"""Tables that survive a log and a narrow terminal (issue #42): piped, every digit on one line at the
table's natural width, whatever $COLUMNS says; on an 80-column terminal, wrapped, never cut with "…"."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.table import Table

from tests.store.helpers import fake_result
from wkvlab.display import TableConsole, results_table

SRC = str(Path(__file__).parents[1] / "src")


def _wide_results():
    return [fake_result(i, weights=f"awq-int4-g128+skip=0,1,2,{i}", kv="llamacpp:q4_0/q8_0+sinks=4+skip=sliding_window") for i in range(3)]


def _cells(table: Table) -> list[str]:
    return [str(cell) for column in table.columns for cell in column._cells]


def test_a_log_keeps_every_cell_whole():
    out = io.StringIO()
    table = results_table(_wide_results(), "title")
    TableConsole(file=out, width=80, force_terminal=False).print(table)
    text = out.getvalue()
    assert "…" not in text
    for cell in _cells(table):
        assert cell in text, cell  # whole, on one line


def test_an_80_column_terminal_wraps_instead_of_cutting():
    out = io.StringIO()
    table = results_table(_wide_results(), "title")
    digits = sum(c.isdigit() for cell in _cells(table) for c in cell)
    TableConsole(file=out, width=80, force_terminal=True, color_system=None).print(table)
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert sum(c.isdigit() for c in re.sub(r"title", "", text)) >= digits  # every digit printed somewhere
    for header in ("weights", "KV", "PPL", "KLD p99", "KV B/token"):  # no column dropped (headers may fold)
        assert header.split()[0][:2] in text


def test_results_piped_to_a_file_keeps_every_digit(tmp_path):
    from wkvlab.store import open_store

    store = tmp_path / "r.db"
    results = _wide_results()
    with open_store(store) as db:
        for i, r in enumerate(results):
            db.put(f"id{i}", {"ctx": 64}, r)
    for columns in ("80", "250", None):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
        env.pop("COLUMNS", None)
        if columns:
            env["COLUMNS"] = columns
        with open(tmp_path / "out.txt", "w") as handle:
            proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "results", "--store", str(store)], stdout=handle,
                                  stderr=subprocess.PIPE, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        text = (tmp_path / "out.txt").read_text()
        assert "…" not in text
        for r in results:
            for cell in (r.weights, r.kv, f"{r.kld['mean']:.5f} ± {r.kld['se']:.5f}", f"{r.ppl:.3f}", f"{100 * r.top1_agreement:.2f}%"):
                assert cell in text, (columns, cell)


def test_a_log_folds_prose_columns_instead_of_padding_every_row():
    """A column of prose (a preset's source, 1,500 characters) once padded every row of `wkvlab presets`
    to 4,000 characters in a log; its text now folds at LOG_PROSE_COLUMN while the numbers stay whole."""
    from wkvlab.display import LOG_PROSE_COLUMN

    out = io.StringIO()
    table = Table("name", "source", "KLD")
    table.columns[2].justify = "right"
    prose = " ".join(f"word{i}" for i in range(400))
    table.add_row("llamacpp:q4_0", prose, "0.123456789")
    table.add_row("int8", "short", "0.000987654")
    TableConsole(file=out, width=140, force_terminal=False).print(table)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) < LOG_PROSE_COLUMN + 40  # the folded prose column, the name and the number
    assert "0.123456789" in out.getvalue() and "0.000987654" in out.getvalue()
    folded = "".join(line.split("│")[2].strip() for line in lines if line.count("│") == 4)
    assert folded.replace(" ", "").startswith("".join(prose.split()[:50]))  # nothing cut, only folded
