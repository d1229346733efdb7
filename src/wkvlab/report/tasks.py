"""Downstream-task scores next to KLD: the report's "Downstream tasks" table and charts.

A task score (``wkvlab tasks``, stored in the ``task_scores`` table) belongs to a model file and a
weights × KV config; a KLD result to the same plus a text and window length (its group). They are
joined on (model SHA-256, weights label, KV label), one row per group the config was measured in;
a score whose config has no KLD result is still listed, with an empty KLD. Pure functions of the
stored rows, like :mod:`wkvlab.report.data`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from wkvlab.report.charts import PALETTE, Chart, Series
from wkvlab.report.data import Group
from wkvlab.report.tables import Column, Table
from wkvlab.store.tasks import TaskScore

NAN = float("nan")


@dataclass(frozen=True)
class TaskRow:
    group: int | None  # the KLD group, None when the config has no KLD result
    group_label: str
    model: str
    weights: str
    kv: str
    task: str
    metric: str
    value: float
    stderr: float | None
    samples: int | None
    kld_mean: float
    kld_se: float
    top1: float

    def to_dict(self) -> dict:
        return asdict(self)


def task_rows(groups: Sequence[Group], scores: Sequence[TaskScore]) -> list[TaskRow]:
    """Each score with the KLD of its config in every group that holds it."""
    index: dict[tuple, list[tuple[Group, object]]] = {}
    for g in groups:
        for r in g.results:
            index.setdefault(((r.fingerprints or {}).get("model_sha256"), r.weights, r.kv), []).append((g, r))
    rows = []
    for s in scores:
        matches = index.get((s.model_sha256, s.weights, s.kv), [])
        for g, r in matches or [(None, None)]:
            kld = r.kld if r is not None else {"mean": NAN, "se": NAN}
            rows.append(TaskRow(g.index if g else None, g.label if g else "no KLD result", s.model, s.weights, s.kv, s.task, s.metric,
                                s.value, s.stderr, s.samples, kld["mean"], kld["se"], r.top1_agreement if r is not None else NAN))
    return rows


def _num(x: float | None, spec: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def tasks_table(rows: Sequence[TaskRow]) -> Table:
    columns = (
        Column("group", lambda r: "" if r.group is None else r.group),
        *(Column(name, lambda r, n=name: getattr(r, n)) for name in ("weights", "kv", "task", "metric")),
        Column("value", lambda r: r.value, lambda r: _num(r.value, ".4f")),
        Column("stderr", lambda r: r.stderr, lambda r: _num(r.stderr, ".4f")),
        Column("samples", lambda r: r.samples, lambda r: "" if r.samples is None else str(r.samples)),
        Column("kld_mean", lambda r: r.kld_mean, lambda r: _num(r.kld_mean, ".5f")),
        Column("kld_se", lambda r: r.kld_se, lambda r: _num(r.kld_se, ".5f")),
        Column("top1", lambda r: r.top1, lambda r: "" if math.isnan(r.top1) else f"{100 * r.top1:.2f}%"),
    )
    return Table("tasks", "Downstream tasks (lm-evaluation-harness) next to KLD", columns, tuple(rows))





def task_charts(rows: Sequence[TaskRow]) -> list[Chart]:
    """Per group and task metric: the metric against mean KLD, one colour per weight config, ± lm-eval's stderr."""
    charts = []
    keys = list(dict.fromkeys((r.group, r.group_label, r.task, r.metric) for r in rows if r.group is not None))
    for n, (group, label, task, metric) in enumerate(keys):
        mine = [r for r in rows if (r.group, r.task, r.metric) == (group, task, metric)]
        weights = list(dict.fromkeys(r.weights for r in mine))
        series = []
        for i, w in enumerate(weights):
            pts = [r for r in mine if r.weights == w]
            err = tuple(r.stderr or 0.0 for r in pts)
            series.append(Series(name=f"weights {w}", x=tuple(r.kld_mean for r in pts), y=tuple(r.value for r in pts),
                                 color=PALETTE[i % len(PALETTE)], error_low=err, error_high=err,
                                 hover=tuple(f"{r.weights} × {r.kv}\n{metric} {r.value:.4f} ± {r.stderr or 0:.4f} ({r.samples} samples)\n"
                                             f"KLD {r.kld_mean:.5f}" for r in pts)))
        charts.append(Chart(id=f"task{n}-{_slug(task)}", title=f"{task} {metric} vs KLD — {label}", x_title="mean KLD vs the unquantized model (nats/token)",
                            y_title=f"{task} {metric}", series=tuple(series),
                            caption="Each marker is one weights × KV config; bars are lm-eval's standard error of the metric."))
    return charts


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:40]
