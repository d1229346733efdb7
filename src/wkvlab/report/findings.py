"""The findings in the report: one section per stored finding (``wkvlab findings``), a table and a chart.

Pure functions of :class:`wkvlab.store.findings.StoredFinding` rows, like :mod:`wkvlab.report.tasks`:
each finding's JSON (rows with their paired intervals) becomes a :class:`Table` (CSV keeps the
interval ends, the page shows "estimate [low, high]") and a :class:`Chart` with the intervals as
error bars, so the page shows what docs/findings.md shows, from the user's own store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from wkvlab.findings.render import percent
from wkvlab.report.charts import PALETTE, Chart, Series
from wkvlab.report.tables import Column, Table
from wkvlab.stats import Interval
from wkvlab.stats.decision import Verdict
from wkvlab.store.findings import StoredFinding

TITLES = {
    "additivity": "Additive or compounding: interaction KLD(W+C) − KLD(W) − KLD(C)",
    "methods": "Which weight methods hurt the cache more: KV penalty under each weight config",
    "attention": "Where the cross term sits inside attention: score-error terms, sinks, layers",
    "calibration": "Calibration domain: KLD by calibration text and evaluation text",
    "depth": "Depth: KV penalty on the same tokens after longer prefixes (stores before issue #24: position buckets, content-confounded)",
    "depth-long": "Depth on the eight longest standard-library modules, to the model's limit (too few documents for a small change)",
    "search": "Weight-aware vs weight-unaware per-layer KV plans",
    "engine": "Engine confirmation: llama.cpp's own KLD next to the presets",
}


@dataclass(frozen=True)
class FindingSection:
    finding: StoredFinding
    title: str
    table: Table
    charts: tuple[Chart, ...]


def _num(x, spec: str = ".5f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _iv_text(iv: dict | None, spec: str = "+.5f") -> str:
    """A stored interval as the tables print it (one wording for a missing interval everywhere)."""
    return "—" if not iv else format(Interval.from_dict(iv), spec)


def _percent(iv: dict | None) -> dict | None:
    """A share's stored interval in percent (None: a row stored without it)."""
    return None if iv is None else percent(Interval.from_dict(iv)).to_dict()


def _bars(ivs: Sequence[dict | None]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Error-bar distances below/above each estimate (0 where there is no interval)."""
    low = tuple(iv["estimate"] - iv["low"] if iv and iv.get("low") is not None else 0.0 for iv in ivs)
    high = tuple(iv["high"] - iv["estimate"] if iv and iv.get("high") is not None else 0.0 for iv in ivs)
    return low, high


def _interval_columns(header: str, get: Callable[[dict], dict | None], spec: str = "+.5f") -> tuple[Column, ...]:
    """The interval as shown text, and its estimate and ends for the CSV."""
    return (Column(header, lambda r: (get(r) or {}).get("estimate"), lambda r: _iv_text(get(r), spec)),
            Column(f"{header} low", lambda r: (get(r) or {}).get("low"), shown=False),
            Column(f"{header} high", lambda r: (get(r) or {}).get("high"), shown=False))


def _interval_chart(cid: str, title: str, y_title: str, groups: dict[str, list[tuple[str, dict | None]]], caption: str,
                    zero_line: bool = True) -> Chart:
    """One series per group over categorical x, each point an interval's estimate with its bars."""
    categories = tuple(dict.fromkeys(x for points in groups.values() for x, _ in points))
    series = []
    for i, (name, points) in enumerate(groups.items()):
        ivs = [iv for _, iv in points]
        low, high = _bars(ivs)
        series.append(Series(name=name, x=tuple(x for x, _ in points), y=tuple(iv["estimate"] if iv else math.nan for iv in ivs),
                             color=PALETTE[i % len(PALETTE)], error_low=low, error_high=high,
                             hover=tuple(f"{name} · {x}\n{_iv_text(iv)}" for x, iv in points)))
    return Chart(id=cid, title=title, x_title="", y_title=y_title, series=tuple(series), x_categories=categories,
                 zero_line=zero_line, caption=caption)


def _grouped(rows: Sequence[dict], series: Callable[[dict], str], point: Callable[[dict], tuple[str, dict | None]]
             ) -> dict[str, list[tuple[str, dict | None]]]:
    """Rows gathered into chart series (in first-seen order), each row one (category, interval) point."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(series(r), []).append(point(r))
    return groups


def _decision(row: dict) -> str:
    """The stored verdict (a row's ``decision``, or a verdict dict itself) with its margin and adjustment;
    rows stored before the one rule say so."""
    d = row if "outcome" in row else row.get("decision")
    if not d:
        return f"{row['verdict']} (old rule: rerun pending)"
    need = Verdict.from_dict(d).need()
    return f"{d['word']} (m ±{d['margin']['value']:.2g}; {d['adjustment']})" + (f"; {need}" if need else "")


def _additivity(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("weights", lambda r: r["weights"]), Column("kv", lambda r: r["kv"]),
               *(Column(k, lambda r, k=k: r[k]["estimate"], lambda r, k=k: _num(r[k]["estimate"])) for k in ("w", "c", "wc")),
               *_interval_columns("interaction", lambda r: r["interaction"]),
               *_interval_columns("Holm-adjusted", lambda r: (r.get("decision") or {}).get("adjusted")),
               Column("% of KLD(C)", lambda r: r.get("share_of_cache"), lambda r: _num(100 * r["share_of_cache"], "+.1f") + "%"
                      if r.get("share_of_cache") is not None else "—"),
               Column("share of sum", lambda r: r["share"], lambda r: _num(100 * r["share"], "+.1f") + "%"),
               Column("verdict", _decision))
    groups = _grouped(rows, lambda r: f"weights {r['weights']}", lambda r: (r["kv"], r["interaction"]))
    chart = _interval_chart(cid, f"Interaction by cache — {f.model}", "KLD(W+C) − KLD(W) − KLD(C)", groups,
                            "Above 0: the errors compound; below: less than their sum. Bars: raw 95% interval, windows resampled; "
                            "verdicts use the Holm-adjusted interval against the margin m in the table.")
    return columns, rows, (chart,)


def _methods(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("weights", lambda r: r["weights"]), Column("kv", lambda r: r["kv"]),
               *_interval_columns("penalty", lambda r: r["penalty"]),
               *_interval_columns("minus the penalty under unquantized weights", lambda r: r["vs_unquantized"]),
               Column("verdict", lambda r: _decision(r) if r.get("decision") else "—"))
    groups = _grouped(rows, lambda r: f"weights {r['weights']}", lambda r: (r["kv"], r["penalty"]))
    chart = _interval_chart(cid, f"KV penalty under each weight config — {f.model}", "KLD(W × C) − KLD(W × fp16)", groups,
                            "Bars: 95% interval, windows resampled.")
    return columns, rows, (chart,)


def _cross(r: dict, effect: str, field: str):
    cross = r.get("cross")
    return cross["effects"][effect][field] if cross else None


def _cross_text(r: dict, effect: str) -> str:
    """An intervention's change with its verdict; rows without both quantized (or stored before the interventions): —."""
    cross = r.get("cross")
    if not cross:
        return "—"
    return f"{cross['effects'][effect]['estimate']:+.5f} → " + _decision(cross["verdicts"][effect])


def _attention(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("weights", lambda r: r["weights"]), Column("kv", lambda r: r["kv"]),
               *(c for t, name in (("kv", "KV term"), ("weight", "weight term"), ("cross", "cross term"))
                 for c in _interval_columns(f"{name} share %", lambda r, t=t: _percent(r["shares"][t]), ".1f")),
               *(c for t, name in (("cross_cache", "cross term's cache part"), ("interaction", "2×2 interaction"))
                 for c in _interval_columns(f"{name} share %", lambda r, t=t: _percent(r["shares"].get(t)), ".1f")),
               Column("removing ε_q·ε_k,cᵀ: KLD change", lambda r: _cross(r, "removed", "estimate"), lambda r: _cross_text(r, "removed")),
               Column("sinks at 16 bits: KLD change", lambda r: _cross(r, "sinks", "estimate"), lambda r: _cross_text(r, "sinks")),
               Column("layers holding most of the cross term", lambda r: ";".join(f"L{t['layer']}:{t['cross_mass']:.3f}" for t in r["top_layers"]),
                      lambda r: ", ".join(f"L{t['layer']} {100 * t['cross_mass']:.0f}%" for t in r["top_layers"])),
               Column("attention KL", lambda r: r["attention_kl"], lambda r: _num(r["attention_kl"], ".2e")))
    groups = _grouped(rows, lambda r: f"cache {r['kv']}", lambda r: (r["weights"], r["shares"]["cross"]))
    chart = _interval_chart(cid, f"Cross term's share of the attention-score error — {f.model}", "share of the term energy", groups,
                            "Bars: 95% interval, windows resampled.", zero_line=False)
    return columns, rows, (chart,)


def _calibration(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    calibs = list(dict.fromkeys(c for r in rows for c in r["kld"]))
    columns = (Column("method", lambda r: r["weights"]), Column("evaluated on", lambda r: r["data"]),
               *(c for name in calibs for c in _interval_columns(f"calibrated on {name}", lambda r, n=name: r["kld"].get(n), ".4f")),
               *(c for name in calibs for c in _interval_columns(f"calibrated on {name} minus own domain", lambda r, n=name: r["mismatch"].get(n), "+.4f")),
               *(Column(f"verdict on {name}", lambda r, n=name: _decision(r["verdicts"][n]) if n in (r.get("verdicts") or {}) else "—")
                 for name in calibs))
    groups = {f"calibrated on {c}": [(f"{r['weights']} on {r['data']}", r["kld"].get(c)) for r in rows if c in r["kld"]] for c in calibs}
    chart = _interval_chart(cid, f"KLD by calibration text — {f.model}", "KLD vs the unquantized model", groups,
                            "Bars: 95% interval, windows resampled.", zero_line=False)
    return columns, rows, (chart,)


def _depth(f: StoredFinding, cid: str):
    if "tables" not in f.data:
        return _identical_depth(f, cid)
    rows = [{**row, "config": f"{t['weights']} × {t['kv']}", "unit": t["unit"]} for t in f.data["tables"] for row in t["rows"]]
    columns = (Column("config", lambda r: r["config"]),
               Column("positions", lambda r: f"{r['start']}-{r['end']}", lambda r: f"{r['start']:,}–{r['end']:,}"),
               Column("tokens", lambda r: r["tokens"], lambda r: f"{r['tokens']:,}"),
               *_interval_columns("penalty", lambda r: r["penalty"]),
               *_interval_columns("minus first bucket", lambda r: r["growth"]),
               Column("relative", lambda r: r["relative_growth"], lambda r: "—" if r["relative_growth"] is None else f"{100 * r['relative_growth']:+.1f}%"),
               Column("resampling unit", lambda r: r["unit"], shown=False))
    groups = _grouped(rows, lambda r: r["config"], lambda r: (f"{r['start']:,}–{r['end']:,}", r["penalty"]))
    chart = _interval_chart(cid, f"KV penalty by position bucket (content-confounded: each bucket holds other text) — {f.model}",
                            "penalty (KLD)", groups,
                            f"Bars: 95% interval, {', '.join(sorted({r['unit'] for r in rows}))} resampled. Content-confounded: no "
                            "depth verdict is drawn from these buckets; rerun `wkvlab findings depth` (identical tokens).", zero_line=False)
    return columns, rows, (chart,)


def _identical_depth(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("kv", lambda r: r["kv"]), Column("prefix tokens", lambda r: r["length"], lambda r: f"{r['length']:,}"),
               *_interval_columns("penalty", lambda r: r["penalty"]),
               *_interval_columns("minus the shortest prefix", lambda r: r["growth"]),
               *_interval_columns("relative growth", lambda r: r["relative"]),
               *_interval_columns("adjusted for the reference's sharpening", lambda r: r.get("adjusted")),
               *_interval_columns("reference NLL change", lambda r: r.get("sharpening")),
               Column("verdict", lambda r: _decision(r) if r.get("decision") else "—"),
               Column("verdict, adjusted", lambda r: _decision(r["adjusted_decision"]) if r.get("adjusted_decision") else "—"))
    groups = _grouped(rows, lambda r: r["kv"], lambda r: (f"{r['length']:,}", r["penalty"]))
    chart = _interval_chart(cid, f"KV penalty on the same tokens after longer prefixes — {f.model}", "penalty (KLD)", groups,
                            f"The same {f.data['target']} target tokens of {f.data['documents']} documents; bars: 95% interval, "
                            "documents resampled.", zero_line=False)
    return columns, rows, (chart,)


def _search(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("profiled on", lambda r: r["profile_text"]),
               Column("budget B/token", lambda r: r["budget"], lambda r: f"{r['budget']:,.0f} ({100 * r['share']:.0f}%)"),
               Column("held-out text", lambda r: r["heldout_text"]),
               Column("aware", lambda r: r["aware"], lambda r: _num(r["aware"])),
               Column("unaware", lambda r: r["unaware"], lambda r: _num(r["unaware"])),
               *_interval_columns("aware − unaware", lambda r: r["aware_minus_unaware"]),
               Column("verdict vs unaware", lambda r: _decision((r.get("verdicts") or {})["unaware"]) if "unaware" in (r.get("verdicts") or {}) else "—"),
               Column("uniform at the budget", lambda r: r["uniform_name"] or "none at this budget"),
               *_interval_columns("aware − uniform", lambda r: r["aware_minus_uniform"]),
               Column("verdict vs uniform", lambda r: _decision((r.get("verdicts") or {})["uniform"]) if "uniform" in (r.get("verdicts") or {}) else "—"),
               *(Column(f"verdict vs {k}", lambda r, k=k: _decision((r.get("verdicts") or {})[k]) if k in (r.get("verdicts") or {}) else "—")
                 for k in ("kvtuner", "greedy", "random")))
    groups = _grouped(rows, lambda r: f"profiled on {r['profile_text']}, held out {r['heldout_text']}",
                      lambda r: (f"{100 * r['share']:.0f}% of 16-bit", r["aware_minus_unaware"]))
    chart = _interval_chart(cid, f"Weight-aware minus weight-unaware plan — {f.model}", "held-out KLD difference", groups,
                            "Below 0: the weight-aware plan's held-out KLD is lower (described; the verdicts, with margin and Holm family, are the "
                            "table's). Bars: 95% interval, held-out "
                            + ("documents" if f.data.get("version", 2) >= 3 else "windows") + " resampled (and, in findings "
                            "stored with replicated profiles, the profiles too: two-stage). Every rival at the same budget.")
    return columns, rows, (chart,)


def _engine(f: StoredFinding, cid: str):
    rows = f.data["rows"]
    columns = (Column("cache", lambda r: r["kv"]), Column("preset", lambda r: r["preset"]),
               Column("llama.cpp KLD", lambda r: r["engine_kld"]["mean"], lambda r: _num(r["engine_kld"]["mean"], ".6f")),
               Column("wkvlab KLD", lambda r: r["sim_kld"]["mean"], lambda r: _num(r["sim_kld"]["mean"], ".6f")),
               Column("ratio", lambda r: r["ratio"], lambda r: _num(r["ratio"], ".2f")))
    series = tuple(Series(name=name, x=tuple(r["kv"] for r in rows), y=tuple(r[key]["mean"] for r in rows), color=PALETTE[i],
                          error_low=tuple(r[key]["se"] for r in rows), error_high=tuple(r[key]["se"] for r in rows))
                   for i, (name, key) in enumerate((("llama.cpp", "engine_kld"), ("wkvlab preset", "sim_kld"))))
    chart = Chart(id=cid, title=f"llama.cpp vs its presets — {f.model}", x_title="", y_title="KLD", series=series,
                  x_categories=tuple(r["kv"] for r in rows), caption="Bars: ± one per-token standard error (tokens are not independent: narrower than a window-bootstrap interval).")
    return columns, rows, (chart,)


BUILDERS = {"additivity": _additivity, "methods": _methods, "attention": _attention, "calibration": _calibration, "depth": _depth,
            "depth-long": _depth, "search": _search, "engine": _engine}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:40]


def finding_sections(findings: Sequence[StoredFinding]) -> list[FindingSection]:
    """A section for every stored finding the report knows how to draw."""
    sections = []
    for n, f in enumerate(findings):
        build = BUILDERS.get(f.name)
        if build is None:
            continue
        name = f"finding-{f.name}-{_slug(f.model)}"
        columns, rows, charts = build(f, f"finding{n}-{f.name}")
        title = f"{TITLES[f.name]} — {f.model}"
        sections.append(FindingSection(f, title, Table(name, title, columns, tuple(rows)), charts))
    return sections
