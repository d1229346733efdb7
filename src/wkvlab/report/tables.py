"""The report's tables: one definition per table, written as CSV (raw numbers), Markdown and HTML (formatted).

A column is (header, raw value, formatted text), so the CSV keeps full precision for other tools
while Markdown and the page show readable numbers, and all three list the same rows.
"""
from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, Callable

from wkvlab.report.data import ReportData
from wkvlab.units import MIB



@dataclass(frozen=True)
class Column:
    header: str
    raw: Callable[[Any], Any]
    text: Callable[[Any], str] | None = None  # None: str(raw)
    shown: bool = True  # False: CSV only (an interval's ends, facts the group heading already states)

    def format(self, row) -> str:
        return self.text(row) if self.text is not None else str(self.raw(row))


@dataclass(frozen=True)
class Table:
    name: str  # file stem: <name>.csv
    title: str
    columns: tuple[Column, ...]
    rows: tuple

    @property
    def shown(self) -> tuple[Column, ...]:
        """The columns the page and Markdown show, decisive ones first (CSV keeps them all)."""
        return tuple(c for c in self.columns if c.shown)

    def raw_rows(self) -> list[list]:
        return [[c.raw(r) for c in self.columns] for r in self.rows]

    def text_rows(self) -> list[list[str]]:
        return [[c.format(r) for c in self.shown] for r in self.rows]


def _signed(x: float) -> str:
    return f"{round(x, 5) + 0.0:+.5f}"  # + 0.0: rounding noise such as -1e-18 prints as +0.00000, not -0.00000


def _interval_text(i) -> str:
    return f"{_signed(i.estimate)} [{_signed(i.low)}, {_signed(i.high)}]"


def _number(header: str, attribute: str, spec: str) -> Column:
    """A numeric field: raw in CSV, formatted with ``spec`` in Markdown and HTML."""
    return Column(header, attrgetter(attribute), lambda r: format(getattr(r, attribute), spec))


KEY_COLUMNS = (Column("weights", attrgetter("weights")), Column("kv", attrgetter("kv")), Column("group", attrgetter("group")))


def _interval_columns(name: str, interval: Callable) -> tuple[Column, ...]:
    """Estimate (shown with its interval), low and high: three CSV columns, readable in Markdown."""
    return (Column(name, lambda r: interval(r).estimate, lambda r: _interval_text(interval(r))),
            Column(f"{name}_low", lambda r: interval(r).low, lambda r: _signed(interval(r).low), shown=False),
            Column(f"{name}_high", lambda r: interval(r).high, lambda r: _signed(interval(r).high), shown=False))


def configs_table(data: ReportData) -> Table:
    ctx = f"{data.context:,}" + (f"×{data.batch}" if data.batch > 1 else "")
    columns = (
        *KEY_COLUMNS,
        Column("pareto", lambda r: int(r.pareto), lambda r: "yes" if r.pareto else ""),
        _number("kld_mean", "kld_mean", ".5f"),
        _number("kld_se", "kld_se", ".5f"),
        Column(f"memory_at_{data.context}", lambda r: r.memory_bytes, lambda r: f"{r.memory_bytes / MIB:,.1f} MiB"),
        Column("weight_bytes", lambda r: r.weight_bytes, lambda r: f"{r.weight_bytes / MIB:,.1f} MiB"),
        Column("kv_bytes_per_token", lambda r: r.kv_bytes_per_token, lambda r: f"{r.kv_bytes_per_token:,.0f} B"),
        _number("kv_bits", "kv_bits", ".2f"),
        _number("kld_p99", "kld_p99", ".4f"),
        Column("top1", lambda r: r.top1, lambda r: f"{100 * r.top1:.2f}%"),
        _number("ppl", "ppl", ".3f"),
        _number("ppl_ref", "ppl_ref", ".3f"),
        *(Column(name, attrgetter(name), shown=False) for name in ("model", "data", "ctx", "tokens")),  # in the group heading
    )
    return Table("configs", f"Configs (memory: weights + KV cache at {ctx} tokens)", columns, data.configs)


def penalty_table(data: ReportData) -> Table:
    columns = (
        *KEY_COLUMNS,
        *_interval_columns("kv_penalty", lambda r: r.penalty),
        Column("kv_class_bits", lambda r: r.kv_class),
        _number("kld_16bit_kv", "kld_16bit_kv", ".5f"),
        _number("kld", "kld", ".5f"),
    )
    return Table("kv_penalty", "KV-cache penalty: KLD(W, C) − KLD(W, 16-bit KV), 95% paired bootstrap interval", columns, data.penalties)


def cross_term_table(data: ReportData) -> Table:
    columns = (
        *KEY_COLUMNS,
        *_interval_columns("interaction", lambda r: r.interaction),
        *_interval_columns("holm_adjusted", lambda r: r.verdict.adjusted if r.verdict else replace(r.interaction, low=math.nan, high=math.nan)),
        Column("verdict", lambda r: r.verdict.outcome if r.verdict else "undecided",
               lambda r: f"{r.verdict.word} (m ±{r.verdict.margin.value:.2g}; {r.verdict.adjustment})" if r.verdict else "undecided"),
        _number("kld_both", "kld_both", ".5f"),
        _number("additive", "additive", ".5f"),
        _number("kld_weights_only", "kld_weights", ".5f"),
        _number("kld_kv_only", "kld_kv", ".5f"),
        _number("kld_baseline", "kld_baseline", ".5f"),
        Column("baseline_weights", lambda r: r.baseline_weights),
    )
    return Table("cross_terms", "Cross-terms: KLD(W+C) − KLD(W) − KLD(C) + KLD(baseline), 95% studentized paired bootstrap interval; "
                 "verdict: the one decision rule (m = 10% of the cache's own KLD, Holm over the group's cross terms)",
                 columns, data.cross_terms)


def report_tables(data: ReportData) -> list[Table]:
    return [configs_table(data), penalty_table(data), cross_term_table(data)]


def to_csv(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.header for c in table.columns])
    writer.writerows(table.raw_rows())
    return out.getvalue()


def _markdown_cell(text: str) -> str:
    # A '|' would split the cell and a newline would end the table; HTML entities keep both visible.
    return html.escape(text, quote=False).replace("|", "&#124;").replace("\n", " ")


def to_markdown(table: Table, empty: str) -> str:
    lines = [f"## {table.title}", ""]
    if not table.rows:
        return "\n".join(lines + [empty, ""])
    lines.append("| " + " | ".join(c.header for c in table.shown) + " |")
    lines.append("|" + "|".join("---" for _ in table.shown) + "|")
    lines += ["| " + " | ".join(_markdown_cell(t) for t in row) + " |" for row in table.text_rows()]
    return "\n".join(lines + [""])


def to_html(table: Table, empty: str) -> str:
    if not table.rows:
        return f"<p class=\"empty\">{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c.header.replace('_', ' '))}</th>" for c in table.shown)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(t)}</td>" for t in row) + "</tr>" for row in table.text_rows())
    return f"<table class=\"data\" id=\"table-{html.escape(table.name)}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


EMPTY = {
    "configs": "No results.",
    "kv_penalty": "No KV penalty: the store holds no weight config with both a 16-bit and a quantized KV cache on the same tokens.",
    "tasks": "No downstream-task scores: run 'wkvlab tasks --tasks <task> --store <file>' to add them.",
    "cross_terms": "No cross-terms: they need (W, 16-bit KV), (16-bit weights, C), (16-bit weights, 16-bit KV) and (W, C) on the same tokens; "
                   "a grid such as 'wkvlab demo' has them.",
}


def markdown_document(data: ReportData, tables: list[Table]) -> str:
    head = [f"# wkvlab report: {_markdown_cell(data.source)}", ""]
    head += [f"- group {g.index}: {_markdown_cell(g.label)}" for g in data.groups] + [""]
    return "\n".join(head) + "\n".join(to_markdown(t, EMPTY.get(t.name, "No rows.")) for t in tables)
