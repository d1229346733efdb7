"""The report page: one self-contained HTML file with plotly.js inline, so it opens offline.

Safety: text from the store (model names, data names, config labels) is HTML-escaped wherever it
enters markup; chart data travels as JSON inside ``<script type="application/json">`` with ``<``,
``>`` and ``&`` written as ``\\u003c`` etc., so no string can close the script element; and plotly's
own pseudo-HTML in labels gets entity-escaped text, so ``<b>`` in a model name is shown, not applied.
A Content-Security-Policy forbids every network request: the page cannot fetch anything even if
a future plotly.js tried to.
"""
from __future__ import annotations

import html
import json
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Sequence

from wkvlab.errors import ConfigError
from wkvlab.io import json_safe
from wkvlab.report.charts import Chart, Heatmap, Series
from wkvlab.report.data import ReportData
from wkvlab.report.tables import EMPTY, Table, to_html

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:"
PLOTLY_CONFIG = {"responsive": True, "displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}
NO_PROFILE = ("No per-layer sensitivity profile was given. Make one with 'wkvlab profile --json profile.json' "
              "and pass it with 'wkvlab report --profile profile.json'.")


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.min.js as shipped in the pinned ``plotly`` wheel (no CDN: the page must work offline)."""
    try:
        text = resources.files("plotly").joinpath("package_data", "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        raise ConfigError("the HTML report needs plotly; install it with: pip install 'wkvlab[report]'") from None
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE)


def plotly_text(text: str) -> str:
    """Plain text → plotly label markup: entities for its tag syntax, <br> for line breaks."""
    return html.escape(str(text), quote=False).replace("\n", "<br>")


def script_json(payload) -> str:
    """JSON safe to place inside a <script> element: nothing in it can end the element or open a comment."""
    text = json.dumps(json_safe(payload), allow_nan=False, ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _symlog(y: float, threshold: float) -> float:
    """plotly has no symmetric log axis: values are drawn at sign(y)·log10(1 + |y|/t) and the ticks
    relabelled with the real values (hover texts always show the real numbers)."""
    return math.copysign(math.log10(1.0 + abs(y) / threshold), y)


def _symlog_ticks(values: list[float], threshold: float) -> dict:
    """Zero and each decade from the threshold up to the data's reach, on each side the data reach: a
    negative decade only where a value (or an error bar's end) is at least that negative, so a penalty of
    -3e-7 inside the linear band shows the 0 tick, not a "-1e-06" one (issue #42)."""
    top = max((v for v in values if v > 0), default=threshold)
    bottom = max((-v for v in values if v < 0), default=0.0)
    decades = [threshold * 10 ** k for k in range(0, max(1, math.ceil(math.log10(max(top / threshold, 1.0)))) + 1)]
    negative = [-threshold * 10 ** k for k in range(0, 12) if threshold * 10 ** k <= bottom]
    ticks = sorted([0.0] + decades + negative)
    return {"tickmode": "array", "tickvals": [_symlog(v, threshold) for v in ticks], "ticktext": [_tick_text(v) for v in ticks]}


def _tick_text(value: float) -> str:
    """A decade as people write it: 0.001, 1e-5 (not Python's 1e-05), -0.01."""
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2), f"{value:g}")


# A label's box in fractions of the plot (plotly's text at 10 px on a plot about 700 × 380 px):
# a character's width and the line's height, and the gap between a marker and its label.
CHAR_WIDTH, LINE_HEIGHT, GAP = 0.0095, 0.04, 0.012
# A marker's box (10 px, an error bar's cap beside it) in the same fractions: labels keep off every marker,
# not only off other labels — in the demo "int4-g128 × fp8_e4m3" was printed over int4-g128 × int8's diamond.
MARKER_HALF_WIDTH, MARKER_HALF_HEIGHT = 0.012, 0.025
POSITIONS = ("top right", "bottom right", "top left", "bottom left", "middle right", "middle left", "top center", "bottom center")


def _label_box(x: float, y: float, width: float, position: str) -> tuple[float, float, float, float]:
    vertical, horizontal = position.split()
    x0 = {"right": x + GAP, "left": x - GAP - width, "center": x - width / 2}[horizontal]
    y0 = {"top": y + GAP, "bottom": y - GAP - LINE_HEIGHT, "middle": y - LINE_HEIGHT / 2}[vertical]
    return x0, y0, x0 + width, y0 + LINE_HEIGHT


def _marker_box(x: float, y: float) -> tuple[float, float, float, float]:
    return x - MARKER_HALF_WIDTH, y - MARKER_HALF_HEIGHT, x + MARKER_HALF_WIDTH, y + MARKER_HALF_HEIGHT


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_positions(chart: Chart) -> dict[int, list[str]]:
    """plotly's textposition per labelled point: the first of :data:`POSITIONS` whose box overlaps no
    label placed so far and no marker, and stays inside the plot; a point with no free place keeps its hover
    text and no label (two configs at the same memory and KLD), so labels never print over each other."""
    points = [(i, j, x, y) for i, s in enumerate(chart.series) if s.labels for j, (x, y) in enumerate(zip(s.x, s.y))]
    if not points:
        return {}
    ys = [(_symlog(y, chart.y_symlog) if chart.y_symlog else y) for *_, y in points]
    xs = [x for _, _, x, _ in points]
    x_span, y_span = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    # plotly pads the axes by about 5% of the span on each side: the plot's fractions of these points
    where = [(0.05 + 0.9 * (x - min(xs)) / x_span, 0.05 + 0.9 * (y - min(ys)) / y_span) for x, y in zip(xs, ys)]
    markers = [_marker_box(fx, fy) for fx, fy in where]
    placed: list[tuple[float, float, float, float]] = []
    out: dict[int, list[str]] = {i: [""] * len(chart.series[i].x) for i, *_ in points}
    hidden: dict[int, set[int]] = {}
    for (i, j, x, _), (fx, fy) in sorted(zip(points, where), key=lambda p: (p[0][2], p[1][1])):
        width = CHAR_WIDTH * len(chart.series[i].labels[j])
        for position in POSITIONS:
            box = _label_box(fx, fy, width, position)
            if (box[0] >= 0 and box[2] <= 1 and box[3] <= 1.02 and not any(_overlap(box, other) for other in placed)
                    and not any(_overlap(box, marker) for marker in markers)):
                placed.append(box)
                out[i][j] = position
                break
        else:
            hidden.setdefault(i, set()).add(j)
    for i, js in hidden.items():  # plotly's position for these does not matter: their text is emptied in _trace
        out[i] = [("hidden" if j in js else p) for j, p in enumerate(out[i])]
    return out


def _trace(s: Series, symlog: float | None = None, label_positions: list[str] | None = None) -> dict:
    symbol = s.symbol if s.filled or s.symbol.endswith("-open") else f"{s.symbol}-open"
    ys = [_symlog(y, symlog) for y in s.y] if symlog else list(s.y)
    trace = {
        "type": "scatter", "mode": s.mode + ("+text" if s.labels else ""), "name": plotly_text(s.name), "x": list(s.x), "y": ys,
        "marker": {"symbol": symbol, "color": s.color, "size": 10, "line": {"width": 2, "color": s.color}},
        "line": {"color": s.color, "width": 2, "dash": s.dash},
        "hovertemplate": "%{customdata}<extra></extra>", "customdata": [plotly_text(h) for h in s.hover] or None,
    }
    if s.labels:
        positions = label_positions or ["top right"] * len(s.labels)
        trace.update(text=["" if p == "hidden" else plotly_text(label) for label, p in zip(s.labels, positions)],
                     textposition=["top right" if p == "hidden" else p for p in positions], textfont={"size": 10, "color": "#333"})
    if s.x and isinstance(s.x[0], str):
        trace["x"] = [plotly_text(x) for x in s.x]
    if s.error_low is not None:
        high, low = list(s.error_high), list(s.error_low)
        if symlog:  # the bar ends, transformed like the points
            high = [_symlog(y + h, symlog) - _symlog(y, symlog) for y, h in zip(s.y, high)]
            low = [_symlog(y, symlog) - _symlog(y - lo, symlog) for y, lo in zip(s.y, low)]
        trace["error_y"] = {"type": "data", "symmetric": False, "array": high, "arrayminus": low,
                            "color": s.color, "thickness": 1.2, "width": 4}
    return trace


def _axis(title: str, **extra) -> dict:
    return {"title": {"text": plotly_text(title)}, "zeroline": False, "automargin": True, **extra}


def plotly_figure(chart: Chart | Heatmap) -> dict:
    layout = {"title": {"text": plotly_text(chart.title)}, "margin": {"t": 50, "r": 20}, "hovermode": "closest",
              "legend": {"orientation": "v"}, "paper_bgcolor": "#ffffff", "plot_bgcolor": "#f7f7f7"}
    if isinstance(chart, Heatmap):
        data = [{"type": "heatmap", "x": [plotly_text(x) for x in chart.x_labels], "y": [plotly_text(y) for y in chart.y_labels],
                 "z": [list(row) for row in chart.z], "colorscale": "Viridis", "reversescale": True,
                 "colorbar": {"title": {"text": plotly_text(chart.colorbar)}},
                 "hovertemplate": "layer %{y}<br>%{x}: %{z:.5f}<extra></extra>"}]
        layout["xaxis"] = _axis(chart.x_title, type="category")
        layout["yaxis"] = _axis(chart.y_title, type="category", autorange="reversed")
        return {"id": chart.id, "data": data, "layout": layout}
    layout["xaxis"] = _axis(chart.x_title, type="log" if chart.x_log else ("category" if chart.x_categories else "linear"))
    if chart.x_ticks:  # whole numbers at each tick, not plotly's "100 2 3 4" within a decade
        layout["xaxis"].update(tickmode="array", tickvals=list(chart.x_ticks), ticktext=[f"{t:,.0f}" for t in chart.x_ticks])
    if chart.x_range:  # plotly's log axis takes its range in decades
        layout["xaxis"]["range"] = [math.log10(v) for v in chart.x_range] if chart.x_log else list(chart.x_range)
    if any("lines" in s.mode and s.dash != "solid" for s in chart.series):
        layout["legend"]["itemwidth"] = 60  # long enough for a dash or dot pattern to show in the legend's sample line
    if chart.x_categories:
        layout["scattermode"] = "group"  # side by side within a category, so equal penalties do not hide each other
        layout["xaxis"]["categoryorder"] = "array"
        layout["xaxis"]["categoryarray"] = [plotly_text(c) for c in chart.x_categories]
    layout["yaxis"] = _axis(chart.y_title, zeroline=chart.zero_line, zerolinecolor="#444", zerolinewidth=1)
    if chart.y_symlog:
        layout["yaxis"].update(_symlog_ticks(_reach(chart), chart.y_symlog))
    positions = _label_positions(chart)
    return {"id": chart.id, "data": [_trace(s, chart.y_symlog, positions.get(i)) for i, s in enumerate(chart.series)], "layout": layout}


def _reach(chart: Chart) -> list[float]:
    """Every value the y axis must show: the points and their error bars' ends."""
    out = []
    for s in chart.series:
        out += s.y
        if s.error_low is not None:
            out += [y - e for y, e in zip(s.y, s.error_low)] + [y + e for y, e in zip(s.y, s.error_high)]
    return out


def _figure_block(chart: Chart | Heatmap) -> str:
    caption = f"<figcaption>{html.escape(chart.caption)}</figcaption>" if chart.caption else ""
    return f"<figure><div class=\"chart\" id=\"{html.escape(chart.id)}\"></div>{caption}</figure>"


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.5em; }
.chart { width: 100%; height: 480px; }
figure { margin: 1em 0 2em 0; } figcaption { color: #555; font-size: 0.9em; }
table.data { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1.5em 0; max-width: 100%; }
table.data th, table.data td { border: 1px solid #ddd; padding: 3px 6px; text-align: right; }
div.table-scroll { overflow-x: auto; max-width: 100%; }
table.data td { white-space: nowrap; }
table.data td.prose { white-space: normal; min-width: 14em; text-align: left; }
table.data td.interval { white-space: normal; } table.data td.interval span { white-space: nowrap; }
table.data th { background: #f3f3f3; white-space: normal; overflow-wrap: normal; hyphens: none; vertical-align: bottom; }
table.data td:nth-child(-n+2), table.data th:nth-child(-n+2) { text-align: left; }
p.empty, p.meta { color: #555; } p.columns { color: #555; font-size: 0.85em; max-width: 70em; }
code { background: #f3f3f3; padding: 1px 4px; }
"""

BOOT = """
(function () {
  var figures = JSON.parse(document.getElementById('wkvlab-figures').textContent);
  var config = JSON.parse(document.getElementById('wkvlab-plotly-config').textContent);
  Promise.all(figures.map(function (f) { return Plotly.newPlot(f.id, f.data, f.layout, config); }))
    .then(function () { document.body.setAttribute('data-charts-rendered', String(figures.length)); });
})();
"""


def render_page(data: ReportData, charts: dict[int, list[Chart]], heatmaps: list[Heatmap], tables: list[Table],
                title: str = "wkvlab report", task_charts: Sequence[Chart] = (), findings: Sequence = ()) -> str:
    """The whole page as one string; every chart's div is filled by the inline script on load."""
    by_name = {t.name: t for t in tables}
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p class=\"meta\">Source: <code>{html.escape(data.source)}</code> · memory at {data.context:,} tokens of context"
             + (f" × batch {data.batch}" if data.batch > 1 else "") + " · KLD vs the unquantized model, nats per token.</p>"]
    figures = []
    for group in data.groups:
        parts.append(f"<h2>{html.escape(group.label)}</h2>")
        for chart in charts.get(group.index, []):
            parts.append(_figure_block(chart))
            figures.append(plotly_figure(chart))
    parts.append("<h2>Per-layer sensitivity</h2>")
    if heatmaps:
        for heatmap in heatmaps:
            parts.append(_figure_block(heatmap))
            figures.append(plotly_figure(heatmap))
    else:
        parts.append(f"<p class=\"empty\" id=\"no-profile\">{html.escape(NO_PROFILE)}</p>")
    for name in ("cross_terms", "kv_penalty", "configs"):
        table = by_name[name]
        parts.append(f"<h2>{html.escape(table.title)}</h2>")
        parts.append(to_html(table, EMPTY[name]))
    if "tasks" in by_name:  # only when the store holds downstream-task scores (wkvlab tasks)
        parts.append(f"<h2 id=\"downstream-tasks\">{html.escape(by_name['tasks'].title)}</h2>")
        for chart in task_charts:
            parts.append(_figure_block(chart))
            figures.append(plotly_figure(chart))
        parts.append(to_html(by_name["tasks"], EMPTY["tasks"]))
    if findings:  # only when the store holds findings' analyses (wkvlab findings)
        parts.append("<h2 id=\"findings\">Findings</h2>")
        for section in findings:
            parts.append(f"<h3>{html.escape(section.title)}</h3>")
            for chart in section.charts:
                parts.append(_figure_block(chart))
                figures.append(plotly_figure(chart))
            parts.append(to_html(section.table, "No rows."))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}: {html.escape(data.source)}</title>\n<style>{STYLE}</style>\n"
        f"<script>{plotly_js()}</script>\n</head>\n<body>\n{body}\n"
        f"<script type=\"application/json\" id=\"wkvlab-data\">{script_json(data.to_dict())}</script>\n"
        f"<script type=\"application/json\" id=\"wkvlab-figures\">{script_json(figures)}</script>\n"
        f"<script type=\"application/json\" id=\"wkvlab-plotly-config\">{script_json(PLOTLY_CONFIG)}</script>\n"
        f"<script>{BOOT}</script>\n</body>\n</html>\n"
    )
