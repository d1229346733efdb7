"""Per-layer sensitivity profiles (``wkvlab profile --json``) → a layers × options matrix for the heatmap.

The file is :meth:`wkvlab.search.profile.SensitivityProfile.to_dict` (docs/search.md). What the
heatmap uses of it, all mean per-token KLD against the unquantized reference:

* ``base.kld``: the weight config ``weights`` with the cache untouched;
* ``k[fmt][l]`` / ``v[fmt][l]``: the same with only layer ``l``'s keys (values) in ``fmt`` — the cell
  is ``k[fmt][l] − base.kld``, what that layer's K (V) in that format adds;
* ``weight_layers[l]`` (may be empty): cache untouched, only layer ``l``'s weights quantized — the
  cell is that KLD itself.

The file is read as JSON here rather than through ``SensitivityProfile`` so the report depends on
the documented format, not on the search package's code; every key it uses is checked.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import DataError

MAKE_ONE = "make one with 'wkvlab profile --json <file>'"


@dataclass(frozen=True)
class Profile:
    title: str
    layers: tuple[int, ...]
    columns: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]  # [layer][column]; None where the profile has no finite value
    column_title: str = "what is quantized in that layer alone"
    value_title: str = "KLD added"
    caption: str = ""

    def to_dict(self) -> dict:
        return {"title": self.title, "layers": list(self.layers), "columns": list(self.columns), "values": [list(r) for r in self.values]}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _per_layer(values, n_layers: int, what: str, source: str) -> list:
    if not isinstance(values, list) or len(values) != n_layers:
        raise DataError(f"{source}: {what} should list one number per layer ({n_layers}); {MAKE_ONE}")
    return values


def profile_from_dict(payload, source: str) -> Profile:
    if not isinstance(payload, dict) or not all(k in payload for k in ("layers", "base", "k", "v")):
        raise DataError(f"{source} is not a wkvlab sensitivity profile (needs layers, base, k, v); {MAKE_ONE}")
    n_layers, base = payload["layers"], _number((payload["base"] or {}).get("kld") if isinstance(payload["base"], dict) else None)
    if not isinstance(n_layers, int) or n_layers < 1 or base is None or not isinstance(payload["k"], dict) or not isinstance(payload["v"], dict):
        raise DataError(f"{source} is not a wkvlab sensitivity profile (layers must be a count, base.kld a number, k and v mappings); {MAKE_ONE}")
    columns: dict[str, list[float | None]] = {}
    for side in ("k", "v"):
        for fmt, row in payload[side].items():
            row = _per_layer(row, n_layers, f"{side}[{fmt}]", source)
            columns[f"{side.upper()} {fmt}"] = [None if _number(x) is None else _number(x) - base for x in row]
    weight_layers = payload.get("weight_layers") or []
    if weight_layers:
        weight_layers = _per_layer(weight_layers, n_layers, "weight_layers", source)
        columns[f"weights {payload.get('weights', '')}".strip()] = [_number(x) for x in weight_layers]
    if not columns:
        raise DataError(f"{source} has no per-layer measurements (k, v and weight_layers are empty); profile with --formats")
    names = tuple(columns)
    values = tuple(tuple(columns[c][layer] for c in names) for layer in range(n_layers))
    label = " · ".join(str(payload[k]) for k in ("model", "data") if payload.get(k)) or Path(source).name
    if payload.get("weights"):
        label += f" · weights {payload['weights']}"
    return Profile(label, tuple(range(n_layers)), names, values,
                   caption=f"From {Path(source).name}: KLD each layer (row) adds when only its keys (K), values (V) or weights "
                           f"are quantized as the column says, above the profile's base KLD {base:.5f}. Darker cells are the layers "
                           "that hurt most: the ones to keep at higher precision.")


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--profile {path} does not exist; make one with 'wkvlab profile --json {path}'")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"--profile {path} is not JSON ({exc}); pass the file 'wkvlab profile --json' wrote") from None
    return profile_from_dict(payload, str(path))
