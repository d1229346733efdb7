"""Per-layer sensitivity profiles (``wkvlab profile`` JSON) → a layers × options matrix for the heatmap.

A profile says, for each layer, how much KLD one quantization option costs when only that layer
uses it. The reader accepts the layouts below and nothing else (anything else is one error line):

* ``{"layers": [{"layer": 0, "kld": {"int4": 0.01, ...}}, ...]}`` — a metric mapping per layer;
* ``{"layers": [{"layer": 0, "int4": 0.01, ...}, ...]}`` — options as numeric fields of each layer.

Optional top-level ``model``, ``data``, ``metric`` and ``title`` label the chart.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import DataError

METRIC_KEYS = ("kld", "kld_mean", "delta_kld", "sensitivity")


@dataclass(frozen=True)
class Profile:
    title: str
    layers: tuple[int, ...]
    columns: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]  # [layer][column]; None where the profile has no value
    column_title: str = "quantization option"
    value_title: str = "KLD"
    caption: str = ""

    def to_dict(self) -> dict:
        return {"title": self.title, "layers": list(self.layers), "columns": list(self.columns), "values": [list(r) for r in self.values]}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _layer_values(entry: dict) -> dict[str, float]:
    for key in METRIC_KEYS:
        if isinstance(entry.get(key), dict):
            return {str(k): v for k, v in entry[key].items() if _number(v) is not None}
    return {str(k): v for k, v in entry.items() if k != "layer" and _number(v) is not None}


def profile_from_dict(payload, source: str) -> Profile:
    layers = payload.get("layers") if isinstance(payload, dict) else None
    if not isinstance(layers, list) or not layers or not all(isinstance(e, dict) and isinstance(e.get("layer"), int) for e in layers):
        raise DataError(f"{source} is not a per-layer profile (expected {{\"layers\": [{{\"layer\": 0, ...}}, ...]}}); "
                        "make one with 'wkvlab profile --json <file>'")
    per_layer = {e["layer"]: _layer_values(e) for e in layers}
    columns = tuple(dict.fromkeys(c for values in per_layer.values() for c in values))
    if not columns:
        raise DataError(f"{source} has layers but no numeric per-layer values to draw; check the file")
    order = sorted(per_layer)
    values = tuple(tuple(_number(per_layer[layer].get(c)) for c in columns) for layer in order)
    metric = str(payload.get("metric", "KLD"))
    label = " · ".join(str(payload[k]) for k in ("title", "model", "data") if payload.get(k)) or Path(source).name
    return Profile(label, tuple(order), columns, values, value_title=metric,
                   caption=f"From {Path(source).name}: {metric} when only one layer (row) uses each option (column). "
                           "Darker cells are layers that option hurts most.")


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--profile {path} does not exist; make one with 'wkvlab profile --json {path}'")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"--profile {path} is not JSON ({exc}); pass the file 'wkvlab profile --json' wrote") from None
    return profile_from_dict(payload, str(path))
