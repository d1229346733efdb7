"""The report reads on its own (issue #26): labels that do not overlap, legends and ticks that say what
the lines and axes are, every table column explained, no NaN where an interval could not be computed."""
from __future__ import annotations

import math

from tests.report.helpers import demo_like_grid, make_result
from wkvlab.report.charts import memory_chart, position_chart
from wkvlab.report.data import build_report_data
from wkvlab.report.html import _label_box, _label_positions, _overlap, plotly_figure
from wkvlab.report.tables import NO_INTERVAL, _interval_text, report_tables, to_html, to_markdown
from wkvlab.stats.bootstrap import Interval


def _data(results=None, **kw):
    return build_report_data(results or demo_like_grid(), source="test", **kw)


def test_an_interval_from_too_few_windows_says_so_instead_of_nan():
    text = _interval_text(Interval(0.0123, math.nan, math.nan, 0.95, 3, 0))
    assert "nan" not in text.lower() and NO_INTERVAL in text and "fewer than 8 windows" in text
    few = [make_result(w, kv, 0.01 + 0.01 * (kv == "int4"), windows=3) for w in ("bf16", "int8") for kv in ("fp16", "int4")]
    page = "".join(to_html(t, "") for t in report_tables(_data(few)))
    assert "nan" not in page.lower() and NO_INTERVAL in page


def test_every_shown_column_is_explained_in_the_caption():
    for table in report_tables(_data()):
        assert table.shown and all(c.doc for c in table.shown), [c.header for c in table.shown if not c.doc]
        caption = table.caption
        assert all(f"{c.header} — " in caption for c in table.shown)
        assert caption in to_markdown(table, "") and "class=\"columns\"" in to_html(table, "")
    assert "group — " in report_tables(_data())[0].caption


def test_memory_caption_says_which_context_the_cache_is_counted_at():
    chart = memory_chart(_data(), 0)
    assert "8,192 tokens" in chart.caption and "not the 64-token windows" in chart.caption and "--context" in chart.caption


def _crowded_chart():
    # fp8 and int8 caches cost nearly the same memory and KLD: labels that used to print over each other
    results = [make_result(w, kv, k) for w, kv, k in (("int4-g128", "int8", 0.0315), ("int8", "int4", 0.0140), ("int8", "int8", 0.0055),
                                                      ("int8", "fp8_e4m3", 0.0060), ("bf16", "int8", 0.0025), ("bf16", "fp8_e4m3", 0.0030),
                                                      ("int4-g128", "fp8_e4m3", 0.0320), ("int4-g128", "fp16", 0.030), ("int8", "fp16", 0.004))]
    results += [make_result("int4-g128", "int4", 0.0316, kv_bytes=520.0)]  # the same memory and KLD as int4-g128 × int8
    return memory_chart(_data(results), 0)


def test_memory_labels_never_overlap_and_a_point_without_room_keeps_only_its_hover():
    chart = _crowded_chart()
    positions = _label_positions(chart)
    boxes, hidden = [], 0
    xs = [x for s in chart.series if s.labels for x in s.x]
    ys = [math.copysign(math.log10(1 + abs(y) / chart.y_symlog), y) for s in chart.series if s.labels for y in s.y]
    for i, s in enumerate(chart.series):
        for j, (x, y) in enumerate(zip(s.x, s.y)):
            if not s.labels:
                continue
            if positions[i][j] == "hidden":
                hidden += 1
                continue
            fy = math.copysign(math.log10(1 + abs(y) / chart.y_symlog), y)
            fx = 0.05 + 0.9 * (x - min(xs)) / ((max(xs) - min(xs)) or 1)
            fy = 0.05 + 0.9 * (fy - min(ys)) / ((max(ys) - min(ys)) or 1)
            boxes.append(_label_box(fx, fy, 0.0095 * len(s.labels[j]), positions[i][j]))
    assert all(not _overlap(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    assert hidden >= 1  # the two coinciding configs cannot both be labelled
    figure = plotly_figure(chart)
    texts = [t for trace in figure["data"] for t in trace.get("text", [])]
    assert "" in texts and all(p != "hidden" for trace in figure["data"] for p in trace.get("textposition", []) if isinstance(p, str))


def test_position_chart_ticks_are_whole_numbers_and_the_legend_shows_dashes():
    data = _data()
    chart = position_chart(data, 0)
    # the axis spans the buckets (centres 7.5 and 39.5 at ctx 64), not 1 to 64: its ticks are the powers of two within
    assert chart.x_ticks == (8.0, 16.0, 32.0) and 4 < chart.x_range[0] < 7.5 and 39.5 < chart.x_range[1] < 64
    figure = plotly_figure(chart)
    axis = figure["layout"]["xaxis"]
    assert axis["tickmode"] == "array" and axis["ticktext"] == ["8", "16", "32"]
    assert axis["range"] == [math.log10(v) for v in chart.x_range]  # plotly's log axis: its range in decades
    assert figure["layout"]["legend"]["itemwidth"] >= 60  # a dash pattern needs room to show in the legend sample
    assert {t["line"]["dash"] for t in figure["data"]} >= {"solid", "dash", "dot"}
    assert "bf16 solid" in chart.caption and "int8 dashed" in chart.caption and "int4-g128 dotted" in chart.caption


def test_symlog_ticks_show_zero_not_a_minus_1e_06_for_float_noise():
    from wkvlab.report.charts import symlog_threshold
    from wkvlab.report.html import _symlog_ticks

    penalties = [0.14, 0.0097, 0.00097, -3e-7]  # bf16 × int8 a hair below bf16 × fp16: float noise, not a gain
    threshold = symlog_threshold(penalties)
    assert threshold == 1e-4  # the smallest real effect's decade, not the noise's (1e-6 before)
    ticks = _symlog_ticks(penalties, threshold)["ticktext"]
    assert ticks == ["0", "0.0001", "0.001", "0.01", "0.1", "1"]
    # a real negative reach gets its decades, and only those the data reach
    assert _symlog_ticks([0.1, -0.002], 1e-3)["ticktext"] == ["-0.001", "0", "0.001", "0.01", "0.1"]
    assert _symlog_ticks([3e-5, 0.5], 1e-5)["ticktext"][:2] == ["0", "1e-5"]


def test_the_png_position_axis_starts_at_the_first_bucket_not_at_1():
    # issue 42: the PNG's axis ran from 1 (its tick list started at 2^0) while the first bucket is centred at 7.5
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from wkvlab.report.png import _draw_chart

    chart = position_chart(_data(), 0)
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_chart(ax, chart)
    low, high = ax.get_xlim()
    assert 4 < low < 7.5 and 39.5 < high < 64
    assert [t for t in ax.get_xticks() if low <= t <= high] == [8.0, 16.0, 32.0]
