"""The report's tables: one definition per table, written as CSV (raw numbers), Markdown and HTML (formatted).

A column is (header, raw value, formatted text), so the CSV keeps full precision for other tools
while Markdown and the page show readable numbers, and all three list the same rows.
"""
from __future__ import annotations

import csv
import html
import io
import math
import re
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, Callable

from wkvlab.report.data import ReportData, quantized_reference_note
from wkvlab.stats.bootstrap import MIN_UNITS
from wkvlab.units import MIB



@dataclass(frozen=True)
class Column:
    header: str
    raw: Callable[[Any], Any]
    text: Callable[[Any], str] | None = None  # None: str(raw)
    shown: bool = True  # False: CSV only (an interval's ends, facts the group heading already states)
    doc: str = ""  # what the column means: every shown column is explained in the table's caption

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

    @property
    def caption(self) -> str:
        """Every shown column, explained (the page and the Markdown print it under the table)."""
        return "Columns: " + "; ".join(f"{c.header} — {c.doc}" for c in self.shown) + "."


def _signed(x: float) -> str:
    return f"{round(x, 5) + 0.0:+.5f}"  # + 0.0: rounding noise such as -1e-18 prints as +0.00000, not -0.00000


NO_INTERVAL = f"no interval (fewer than {MIN_UNITS} windows)"


def _interval_text(i) -> str:
    if not (math.isfinite(i.low) and math.isfinite(i.high)):  # the bootstrap refuses too few windows (stats/bootstrap.py)
        return f"{_signed(i.estimate)} {NO_INTERVAL}"
    return f"{_signed(i.estimate)} [{_signed(i.low)}, {_signed(i.high)}]"


def _number(header: str, attribute: str, spec: str, doc: str = "") -> Column:
    """A numeric field: raw in CSV, formatted with ``spec`` in Markdown and HTML."""
    return Column(header, attrgetter(attribute), lambda r: format(getattr(r, attribute), spec), doc=doc)


KEY_COLUMNS = (Column("weights", attrgetter("weights"), doc="the weight config (--weights)"),
               Column("kv", attrgetter("kv"), doc="the KV-cache config (--kv)"),
               Column("group", attrgetter("group"), doc="which group of results the row belongs to: the same model, text, window "
                                                        "length and tokens, numbered as in the group headings (rows of one group are paired)"))


def _interval_columns(name: str, interval: Callable, doc: str = "") -> tuple[Column, ...]:
    """Estimate (shown with its interval), low and high: three CSV columns, readable in Markdown."""
    doc = f"{doc}, with its 95% paired bootstrap interval over windows in brackets ({NO_INTERVAL} when the windows are too few)"
    return (Column(name, lambda r: interval(r).estimate, lambda r: _interval_text(interval(r)), doc=doc),
            Column(f"{name}_low", lambda r: interval(r).low, lambda r: _signed(interval(r).low), shown=False),
            Column(f"{name}_high", lambda r: interval(r).high, lambda r: _signed(interval(r).high), shown=False))


def configs_table(data: ReportData) -> Table:
    ctx = f"{data.context:,}" + (f"×{data.batch}" if data.batch > 1 else "")
    columns = (
        *KEY_COLUMNS,
        Column("pareto", lambda r: int(r.pareto), lambda r: "yes" if r.pareto else "",
               doc="yes when no other config of the group has both less memory and a lower mean KLD"),
        _number("kld_mean", "kld_mean", ".5f", "mean KL divergence from the unquantized model's next-token distribution (nats/token)"),
        _number("kld_se", "kld_se", ".5f", "its standard error over tokens"),
        Column(f"memory_at_{data.context}", lambda r: r.memory_bytes, lambda r: f"{r.memory_bytes / MIB:,.1f} MiB",
               doc=f"weights plus the KV cache of {ctx} tokens: a served context ('wkvlab report --context', default 8,192), "
                   "not the evaluated window"),
        Column("weight_bytes", lambda r: r.weight_bytes, lambda r: f"{r.weight_bytes / MIB:,.1f} MiB",
               doc="the weights as an engine stores them (codes, scales, 16-bit embeddings; the unquantized model as stored)"),
        Column("kv_bytes_per_token", lambda r: r.kv_bytes_per_token, lambda r: f"{r.kv_bytes_per_token:,.0f} B",
               doc="KV-cache bytes per token over all layers"),
        _number("kv_bits", "kv_bits", ".2f", "KV-cache bits per element, scales included"),
        _number("kld_p99", "kld_p99", ".4f", "99th percentile of the per-token KLD"),
        Column("top1", lambda r: r.top1, lambda r: f"{100 * r.top1:.2f}%", doc="tokens whose most likely next token matches the unquantized model's"),
        _number("ppl", "ppl", ".3f", "perplexity on the text"),
        _number("ppl_ref", "ppl_ref", ".3f", "the unquantized model's perplexity on the same tokens"),
        *(Column(name, attrgetter(name), shown=False) for name in ("model", "data", "ctx", "tokens")),  # in the group heading
    )
    return Table("configs", f"Configs (memory: weights + KV cache at {ctx} tokens)", columns, data.configs)


def penalty_table(data: ReportData) -> Table:
    columns = (
        *KEY_COLUMNS,
        *_interval_columns("kv_penalty", lambda r: r.penalty, "KLD added by the KV cache: KLD(W, C) − KLD(W, 16-bit KV)"),
        Column("kv_class_bits", lambda r: r.kv_class, doc="the cache's bit class (16, 8, 4 or 2), as the charts' markers"),
        _number("kld_16bit_kv", "kld_16bit_kv", ".5f", "KLD of the same weights with a 16-bit cache"),
        _number("kld", "kld", ".5f", "KLD of the weights with this cache"),
    )
    return Table("kv_penalty", "KV-cache penalty: KLD(W, C) − KLD(W, 16-bit KV), 95% paired bootstrap interval", columns, data.penalties)


def cross_term_table(data: ReportData) -> Table:
    columns = (
        *KEY_COLUMNS,
        *_interval_columns("interaction", lambda r: r.interaction, "KLD(W+C) − KLD(W) − KLD(C) + KLD(baseline): what the pair adds beyond the sum"),
        *_interval_columns("holm_adjusted", lambda r: r.verdict.adjusted if r.verdict else replace(r.interaction, low=math.nan, high=math.nan),
                           "the interaction's interval widened by Holm's adjustment over the group's cross terms (the family)"),
        Column("verdict", lambda r: r.verdict.outcome if r.verdict else "undecided",
               lambda r: f"{r.verdict.word} (m ±{r.verdict.margin.value:.2g}; {r.verdict.adjustment})" if r.verdict else "undecided",
               doc="the one decision rule: compounds / sub-additive beyond ±m, additive within ±m, else undecided"),
        _number("kld_both", "kld_both", ".5f", "KLD of W and C together"),
        _number("additive", "additive", ".5f", "what the two would give if their errors simply added"),
        _number("kld_weights_only", "kld_weights", ".5f", "KLD of W with a 16-bit cache"),
        _number("kld_kv_only", "kld_kv", ".5f", "KLD of C with the baseline weights"),
        _number("kld_baseline", "kld_baseline", ".5f", "KLD of the baseline (baseline weights, 16-bit cache)"),
        Column("baseline_weights", lambda r: r.baseline_weights, doc="the 16-bit weight config the factorial is measured against"),
    )
    return Table("cross_terms", "Cross-terms: KLD(W+C) − KLD(W) − KLD(C) + KLD(baseline), 95% skew-robust t interval paired over windows (analytic, "
                 "docs/stats.md); verdict: the one decision rule (m = 10% of the predicted total KLD(W)+KLD(C), Holm over the group's "
                 "cross terms)",
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
    if all(c.doc for c in table.shown):
        lines += ["", _markdown_cell(table.caption)]
    return "\n".join(lines + [""])


# A cell longer than this is prose (a verdict with its reason) and wraps at its spaces; shorter cells stay on
# one line. Before, every cell was one line and the cross-term table ran 1,645 px wide (issue #42).
PROSE_CHARS = 40
INTERVAL = re.compile(r"(\S+) (\[.*\])")


def _html_cell(text: str) -> str:
    """One <td>: an estimate with its interval may break between the two, prose at its spaces, numbers never."""
    interval = INTERVAL.fullmatch(text)
    if interval:
        return f"<td class=\"interval\"><span>{html.escape(interval[1])}</span> <span>{html.escape(interval[2])}</span></td>"
    return f"<td class=\"prose\">{html.escape(text)}</td>" if len(text) > PROSE_CHARS else f"<td>{html.escape(text)}</td>"


def to_html(table: Table, empty: str) -> str:
    if not table.rows:
        return f"<p class=\"empty\">{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c.header.replace('_', ' '))}</th>" for c in table.shown)
    body = "".join("<tr>" + "".join(_html_cell(t) for t in row) + "</tr>" for row in table.text_rows())
    caption = f"<p class=\"columns\">{html.escape(table.caption)}</p>" if all(c.doc for c in table.shown) else ""
    # The scroller keeps a table wider than the window (a narrow one) from widening the whole page.
    return (f"<div class=\"table-scroll\"><table class=\"data\" id=\"table-{html.escape(table.name)}\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>{caption}")


EMPTY = {
    "configs": "No results.",
    "kv_penalty": "No KV penalty: the store holds no weight config with both a 16-bit and a quantized KV cache on the same tokens.",
    "tasks": "No downstream-task scores: run 'wkvlab tasks --tasks <task> --store <file>' to add them.",
    "cross_terms": "No cross-terms: they need (W, 16-bit KV), (16-bit weights, C), (16-bit weights, 16-bit KV) and (W, C) on the same tokens; "
                   "a grid such as 'wkvlab demo' has them.",
}


def markdown_document(data: ReportData, tables: list[Table]) -> str:
    head = [f"# wkvlab report: {_markdown_cell(data.source)}", ""]
    head += [f"- group {g.index}: {_markdown_cell(g.label)}" + (f" — {_markdown_cell(note)}" if (note := quantized_reference_note(g)) else "")
             for g in data.groups] + [""]
    return "\n".join(head) + "\n".join(to_markdown(t, EMPTY.get(t.name, "No rows.")) for t in tables)
