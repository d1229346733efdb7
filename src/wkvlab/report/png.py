"""The same chart specs as static PNGs (matplotlib, Agg): for docs, slides and places without a browser.

Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly, never pyplot, so
nothing depends on a display or on global pyplot state.
"""
from __future__ import annotations

import io

from wkvlab.errors import ConfigError
from wkvlab.report.charts import Chart, Heatmap

MARKERS = {"circle": "o", "diamond": "D", "triangle-up": "^", "square": "s"}
LINESTYLES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}
DPI = 110


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise ConfigError("PNG charts need matplotlib; install it with: pip install 'wkvlab[report]'") from None
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw_chart(ax, chart: Chart) -> list[tuple[float, float, str]]:
    """Draw the series; returns the labelled points (x, y, label) for :func:`_place_labels`."""
    categories = list(chart.x_categories or ())
    width = 0.5 / max(len(chart.series), 1)  # series side by side within a category, as plotly's scattermode "group"
    labelled = []
    for i, s in enumerate(chart.series):
        dodge = (i - (len(chart.series) - 1) / 2) * width
        x = [categories.index(v) + dodge for v in s.x] if categories else list(s.x)
        marker = MARKERS.get(s.symbol.removesuffix("-open"), "o") if "markers" in s.mode else None
        face = s.color if s.filled and not s.symbol.endswith("-open") else "none"
        linestyle = LINESTYLES.get(s.dash, "-") if "lines" in s.mode else "none"
        kwargs = dict(color=s.color, marker=marker, markerfacecolor=face, markeredgecolor=s.color, markersize=7,
                      linestyle=linestyle, linewidth=1.6, label=s.name)
        if s.error_low is not None:
            ax.errorbar(x, s.y, yerr=[s.error_low, s.error_high], elinewidth=1, capsize=3, **kwargs)
        else:
            ax.plot(x, s.y, **kwargs)
        labelled += list(zip(x, s.y, s.labels))
    if categories:
        ax.set_xticks(range(len(categories)), categories, rotation=15, ha="right")
        ax.set_xlim(-0.5, len(categories) - 0.5)
    if chart.x_log:
        ax.set_xscale("log")
    if chart.x_ticks:  # whole numbers at each tick (matplotlib's log axis writes 10^2 and leaves 2, 4, 8 unlabelled)
        ax.set_xticks(list(chart.x_ticks), [f"{t:,.0f}" for t in chart.x_ticks])
        ax.minorticks_off()
    if chart.x_range:  # the ticks alone would stretch the axis to 1 while the first bucket sits near 8
        ax.set_xlim(*chart.x_range)
    if chart.y_symlog:
        ax.set_yscale("symlog", linthresh=chart.y_symlog, linscale=0.5)
        lowest = min((y - (s.error_low[k] if s.error_low is not None else 0.0) for s in chart.series for k, y in enumerate(s.y)), default=0.0)
        highest = max(y + (s.error_high[k] if s.error_high is not None else 0.0) for s in chart.series for k, y in enumerate(s.y))
        # no negative values: no negative decades (the zero line would otherwise pull them in); negative ones: only
        # as far down as the lowest bar reaches, not the decades matplotlib's autoscale adds below it
        bottom = 0.0 if lowest >= 0 else -_symlog_top(-lowest, chart.y_symlog)
        ax.set_ylim(bottom=bottom, top=_symlog_top(highest, chart.y_symlog))
    if chart.zero_line:
        ax.axhline(0.0, color="#444", linewidth=0.8, linestyle="--")
    ax.grid(True, alpha=0.3)
    # Outside the axes, right of the plot: a legend inside covers data points (the position chart's first buckets).
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return labelled


def _symlog_top(highest: float, threshold: float) -> float:
    """An upper limit a quarter decade above the highest value, so the top markers are not cut."""
    return max(highest, threshold) * 10 ** 0.25


# Label offsets in points, tried in order: a label goes to the first place where it overlaps no
# label already drawn (points close in memory, such as fp8 and int8 caches, get labels apart);
# a label with no free place is left out.
LABEL_OFFSETS = ((6, 4), (6, -12), (-6, 4), (-6, -12), (6, 14), (6, -22), (-6, 14), (-6, -22))


def _place_labels(fig, ax, points: list[tuple[float, float, str]]) -> None:
    if not points:
        return
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # final axes limits and layout before measuring label boxes
    placed = []
    for x, y, text in sorted(points, key=lambda p: (p[0], p[1])):
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7, color="#333",
                                ha="left" if dx > 0 else "right")
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()  # no free place at all: no label rather than one printed over another (the page's hover has it)


def _draw_heatmap(fig, ax, chart: Heatmap) -> None:
    import numpy as np

    z = np.array([[np.nan if v is None else v for v in row] for row in chart.z], dtype=float)
    image = ax.imshow(z, aspect="auto", cmap="viridis_r", interpolation="nearest")
    ax.set_xticks(range(len(chart.x_labels)), chart.x_labels, rotation=30, ha="right", fontsize=8)
    step = max(1, len(chart.y_labels) // 30)  # a label per row up to 30 rows, then every n-th
    ax.set_yticks(range(0, len(chart.y_labels), step), chart.y_labels[::step], fontsize=8)
    fig.colorbar(image, ax=ax, label=chart.colorbar)


def render_png(chart: Chart | Heatmap) -> bytes:
    """One chart as PNG bytes."""
    fig = _figure(8.5 if isinstance(chart, Heatmap) else 10.5, 5.0)
    ax = fig.add_subplot()
    ax.set_title(chart.title)
    ax.set_xlabel(chart.x_title)
    ax.set_ylabel(chart.y_title)
    if isinstance(chart, Heatmap):
        _draw_heatmap(fig, ax, chart)
    else:
        _place_labels(fig, ax, _draw_chart(ax, chart))
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": "wkvlab"})  # no matplotlib version/date: same chart, same bytes
    return out.getvalue()
