"""Chart specs: what each chart shows, independent of who draws it.

The HTML page (plotly.js) and the PNGs (matplotlib) render the same :class:`Chart` objects, so the
two can never disagree. Text here is plain text; each renderer escapes it for its own markup.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from wkvlab.report.data import ConfigRow, PenaltyRow, PositionCurve, ReportData, pareto_front, quantized_reference_note
from wkvlab.report.profiles import Profile
from wkvlab.units import GIB, MIB

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# Marker per KV bit class, after the seed study's final chart: circles for the 16-bit cache,
# diamonds for 8-bit, triangles for 4-bit (squares for anything below).
CLASS_SYMBOL = {16: "circle", 8: "diamond", 4: "triangle-up", 2: "square"}
CLASS_COLOR = {16: "#7f7f7f", 8: "#1f77b4", 4: "#d62728", 2: "#9467bd"}
DASHES = ("solid", "dash", "dot", "dashdot")
DASH_WORDS = {"solid": "solid", "dash": "dashed", "dot": "dotted", "dashdot": "dash-dotted"}  # the position chart's caption


@dataclass(frozen=True)
class Series:
    name: str
    x: tuple
    y: tuple[float, ...]
    mode: str = "markers"  # markers | lines | lines+markers
    symbol: str = "circle"
    filled: bool = True
    color: str = PALETTE[0]
    dash: str = "solid"  # solid | dash | dot | dashdot (lines only)
    hover: tuple[str, ...] = ()  # one text per point, lines separated by "\n"
    error_low: tuple[float, ...] | None = None  # distances below/above y
    error_high: tuple[float, ...] | None = None
    labels: tuple[str, ...] = ()  # a short label drawn next to each point (empty: none)


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    x_title: str
    y_title: str
    series: tuple[Series, ...]
    x_log: bool = False
    x_categories: tuple[str, ...] | None = None  # categorical x axis, in this order
    zero_line: bool = False
    caption: str = ""
    # Symmetric log y axis, linear within ±y_symlog: KLDs and penalties span 1e-5 to 1, and on a
    # linear axis every 8-bit cache sits flat on zero. None: linear.
    y_symlog: float | None = None
    # Tick values of a log x axis, each labelled with its whole number (plotly's own log ticks read
    # "100 2 3 4" within a decade); None: the renderer's own.
    x_ticks: tuple[float, ...] | None = None
    # The x axis's extent (data units): None lets the renderer choose. The position chart's ticks alone would
    # stretch a matplotlib axis from 1 while its first bucket is centred near 8 (issue #42).
    x_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class Heatmap:
    id: str
    title: str
    x_title: str
    y_title: str
    x_labels: tuple[str, ...]
    y_labels: tuple[str, ...]
    z: tuple[tuple[float | None, ...], ...]  # rows follow y_labels
    colorbar: str
    caption: str = ""
    kind: str = field(default="heatmap", init=False)


# Values this far below the largest |value| are noise around zero (a penalty of -3e-7 next to 0.14): they sit
# in the linear band rather than pulling the band down to 1e-6 and labelling a "-1e-06" tick (issue #42).
NEGLIGIBLE = 1e-5


def symlog_threshold(values) -> float:
    """The linear range of a symmetric log axis: the decade of the smallest |value| that is not negligible next
    to the largest (within 1e-6 .. 1e-2), so the smallest real effect still gets its own decade above the linear band."""
    magnitudes = [abs(v) for v in values if v]
    top = max(magnitudes, default=0.0)
    small = min((m for m in magnitudes if m >= NEGLIGIBLE * top), default=1e-4)
    return min(1e-2, max(1e-6, 10 ** math.floor(math.log10(small))))


def memory_unit(max_bytes: float) -> tuple[str, float]:
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", MIB)


def _config_hover(row: ConfigRow, unit: str, scale: float) -> str:
    return (f"weights {row.weights}, KV {row.kv}\nmemory {row.memory_bytes / scale:,.1f} {unit}"
            f"\nKLD {row.kld_mean:.5f} ± {row.kld_se:.5f}\ntop-1 {100 * row.top1:.2f}%")


def memory_chart(data: ReportData, group: int) -> Chart:
    """KLD versus weights + KV cache at the chosen context, one marker shape per KV class, Pareto line."""
    rows = data.in_group(data.configs, group)
    unit, scale = memory_unit(max(r.memory_bytes for r in rows))
    series = []
    for cls in sorted({r.kv_class for r in rows}, reverse=True):
        members = [r for r in rows if r.kv_class == cls]
        series.append(Series(f"{cls}-bit KV", tuple(r.memory_bytes / scale for r in members), tuple(r.kld_mean for r in members),
                             symbol=CLASS_SYMBOL[cls], color=CLASS_COLOR[cls], hover=tuple(_config_hover(r, unit, scale) for r in members),
                             error_low=tuple(r.kld_se for r in members), error_high=tuple(r.kld_se for r in members),
                             labels=tuple(f"{r.weights} × {r.kv}" for r in members)))
    front = [rows[i] for i in pareto_front([r.memory_bytes for r in rows], [r.kld_mean for r in rows])]
    series.append(Series("Pareto front", tuple(r.memory_bytes / scale for r in front), tuple(r.kld_mean for r in front),
                         mode="lines", color="#000000", hover=tuple(_config_hover(r, unit, scale) for r in front)))
    context = f"{data.context:,} tokens" + (f" × batch {data.batch}" if data.batch > 1 else "")
    windows = ", ".join(f"{w:,}" for w in sorted({r.ctx for r in rows}))
    return Chart(f"g{group}-memory", "KLD versus memory (weights + KV cache)", f"weights + KV cache at {context} ({unit})",
                 "mean KLD vs unquantized (nats/token, symlog)", tuple(series), y_symlog=symlog_threshold(r.kld_mean for r in rows),
                 caption=f"Each marker is one weights × KV config (labelled weights × KV); its memory is the weights plus the KV cache of {context}: "
                         f"the context a server would hold ('wkvlab report --context', default 8,192), not the {windows}-token windows "
                         "the KLD was measured on — the cache grows with the served context, the KLD per token is the window's. "
                         "The line joins the configs no other config beats on both memory and KLD. Bars: ± standard error over tokens. "
                         "The KLD axis is logarithmic above its smallest decade and linear below it, so small and large losses both show."
                         + (f" {note}" if (note := quantized_reference_note(next(g for g in data.groups if g.index == group))) else ""))


def penalty_chart(data: ReportData, group: int) -> Chart | None:
    """KV penalty (KLD added to the same weights at 16-bit KV) by weight config: open = 8-bit KV, filled = 4-bit."""
    rows: list[PenaltyRow] = data.in_group(data.penalties, group)
    if not rows:
        return None
    sizes = {}
    for r in rows:
        sizes.setdefault(r.weights, r.weight_bytes)
    unit, scale = memory_unit(max(sizes.values()))
    order = sorted(sizes, key=lambda w: (-sizes[w], w))  # most precise weights first, as precision falls left to right
    ticks = {w: f"{w} ({sizes[w] / scale:,.0f} {unit})" for w in order}
    series = []
    for i, kv in enumerate(dict.fromkeys(r.kv for r in rows)):
        members = [r for r in rows if r.kv == kv]
        cls = members[0].kv_class
        series.append(Series(f"{kv} ({cls}-bit)", tuple(ticks[r.weights] for r in members), tuple(r.penalty.estimate for r in members),
                             symbol="triangle-up" if cls <= 2 else "circle", filled=cls <= 4, color=PALETTE[i % len(PALETTE)],
                             hover=tuple(f"weights {r.weights}, KV {r.kv}\nKV penalty {r.penalty.estimate:+.5f}"
                                         f"\n95% CI [{r.penalty.low:+.5f}, {r.penalty.high:+.5f}]\nKLD {r.kld_16bit_kv:.5f} → {r.kld:.5f}"
                                         for r in members),
                             error_low=tuple(r.penalty.estimate - r.penalty.low for r in members),
                             error_high=tuple(r.penalty.high - r.penalty.estimate for r in members)))
    return Chart(f"g{group}-penalty", "KV-cache penalty versus weight precision", "weight config (size)",
                 "KLD added by the KV cache (nats/token, symlog)", tuple(series), x_categories=tuple(ticks[w] for w in order), zero_line=True,
                 y_symlog=symlog_threshold(r.penalty.estimate for r in rows),
                 caption="Height: KLD(weights, KV) − KLD(same weights, 16-bit KV), paired on the same tokens. "
                         "Open markers: 8-bit KV; filled: 4-bit KV (triangles: below 4 bits). "
                         "Bars: 95% paired bootstrap interval over windows. The axis is logarithmic above its smallest decade "
                         "(linear below), so an 8-bit cache's small penalty does not vanish next to a 4-bit one.")


POSITION_PAD = 1.3  # the position axis reaches this factor beyond the first and last bucket centres (log scale)


def position_chart(data: ReportData, group: int) -> Chart:
    curves: list[PositionCurve] = data.in_group(data.positions, group)
    # Colour by KV config and dash by weight config: a grid of 3 × 4 stays tellable apart.
    kv_color = {kv: PALETTE[i % len(PALETTE)] for i, kv in enumerate(dict.fromkeys(c.kv for c in curves))}
    weight_dash = {w: DASHES[i % len(DASHES)] for i, w in enumerate(dict.fromkeys(c.weights for c in curves))}
    series = []
    centres = [(a + b - 1) / 2 for c in curves for a, b in zip(c.starts, c.ends)]
    low, high = (min(centres), max(centres)) if centres else (1.0, 2.0)
    x_range = (low / POSITION_PAD, high * POSITION_PAD)  # the buckets, not the axis's 1: the first centre is near 8
    ticks = tuple(2.0 ** k for k in range(math.ceil(math.log2(x_range[0])), math.floor(math.log2(x_range[1])) + 1))
    for c in curves:
        centers = tuple((a + b - 1) / 2 for a, b in zip(c.starts, c.ends))
        series.append(Series(f"{c.weights} / {c.kv}", centers, c.kld_mean, mode="lines+markers", color=kv_color[c.kv], dash=weight_dash[c.weights],
                             hover=tuple(f"weights {c.weights}, KV {c.kv}\npositions {a}–{b - 1} ({n} tokens)\nKLD {k:.5f}"
                                         for a, b, k, n in zip(c.starts, c.ends, c.kld_mean, c.tokens))))
    dashes = ", ".join(f"{w} {DASH_WORDS[d]}" for w, d in weight_dash.items())
    return Chart(f"g{group}-position", "KLD by position in the context window", "query position (bucket centre, log scale)",
                 "mean KLD (nats/token, symlog)", tuple(series), x_log=True,
                 y_symlog=symlog_threshold(k for c in curves for k in c.kld_mean),
                 x_ticks=ticks, x_range=x_range,
                 caption=f"Mean KLD of the tokens in each position bucket (buckets double in width); colour: KV config, line: weight config "
                         f"({dashes}). Each bucket holds other text: a line rising to the right mixes position with content "
                         "(wkvlab findings depth decides depth on identical tokens).")


def sensitivity_heatmap(profile: Profile, index: int) -> Heatmap:
    return Heatmap(f"profile{index}-sensitivity", f"Per-layer sensitivity: {profile.title}", profile.column_title, "layer",
                   profile.columns, tuple(str(layer) for layer in profile.layers), profile.values, profile.value_title,
                   caption=profile.caption)


def group_charts(data: ReportData, group: int) -> list[Chart]:
    charts = [memory_chart(data, group), penalty_chart(data, group), position_chart(data, group)]
    return [c for c in charts if c is not None]
