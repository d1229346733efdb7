"""The sweep spec: a YAML file naming the axes whose product is the set of configs to run.

    models: [default]                    # packaged names, .gguf files, HF folders
    data: [default]                      # as --data
    ctx: 512                             # one value or a list (each is its own axis value)
    tokens: 4096
    score: all                           # all | second-half
    weights: [bf16, int8, int4-g128]     # as --weights, or a mapping of WeightSpec fields
    kv: [fp16, fp8_e4m3, int8, int4]     # as --kv, or a mapping of KVSpec fields
    calibration: {data: prose, samples: 16, length: 512}   # only for configs that need it
    grid: group                          # group | weight  (see wkvlab.sweep.plan.make_tasks)
    replicate: 0                         # r ≥ 1: the same configs measured again (another calibration
                                         # sample, chunks halved r times), each its own config id

Parsing validates everything a sweep could fail on late (format names, option values) before
any model is loaded, so a typo in the last KV entry costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.weights.calibration import CalibrationSpec
from wkvlab.weights.spec import WeightSpec

GRID_MODES = ("group", "weight")
_KEYS = ("name", "models", "data", "ctx", "tokens", "score", "stride", "weights", "kv", "calibration", "grid",
         "device", "dtype", "chunk", "reference", "replicate")


def _list(raw: dict, key: str, default) -> list:
    value = raw.get(key, default)
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"sweep spec: '{key}' is an empty list; give at least one value")
    return values


def _ints(raw: dict, key: str, default: int) -> tuple[int, ...]:
    values = _list(raw, key, default)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigError(f"sweep spec: '{key}' must be a positive integer or a list of them, got {raw.get(key)!r}")
    return tuple(values)


def _strings(raw: dict, key: str, default: str) -> tuple[str, ...]:
    values = _list(raw, key, default)
    if not all(isinstance(v, str) and v.strip() for v in values):
        raise ConfigError(f"sweep spec: '{key}' must be a name or a list of names, got {raw.get(key)!r}")
    return tuple(v.strip() for v in values)


def _weight(item) -> WeightSpec:
    return WeightSpec.from_dict(item) if isinstance(item, dict) else WeightSpec.parse(str(item))


def _kv(item) -> KVSpec:
    return KVSpec.from_dict(item) if isinstance(item, dict) else KVSpec.parse(str(item))


@dataclass(frozen=True)
class SweepSpec:
    """The axes of a sweep; :func:`wkvlab.sweep.plan.expand` turns them into configs."""

    models: tuple[str, ...] = ("default",)
    data: tuple[str, ...] = ("default",)
    ctx: tuple[int, ...] = (1024,)
    tokens: tuple[int, ...] = (8192,)
    score: tuple[str, ...] = ("all",)
    weights: tuple[WeightSpec, ...] = (WeightSpec.parse("none"),)
    kv: tuple[KVSpec, ...] = (KVSpec.parse("fp16"),)
    calibration: CalibrationSpec = CalibrationSpec()
    stride: int | None = None
    grid: str = "group"
    name: str = "sweep"
    # where and how the grids run (as wkvlab eval's --device/--dtype/--chunk); ``reference``: a
    # folder for stored references, one file per group of windows (KLD then against those files)
    device: str = "auto"
    dtype: str = "auto"
    chunk: int | None = None
    reference: str | None = None
    # replicate r ≥ 1: every config measured again with the r-th disjoint calibration sample (configs that read
    # one) and chunks halved r times (another float order), for run-to-run variance inside the intervals
    # (wkvlab.stats.replicates); 0: the measurement itself, whose config ids are what they were before replicates
    replicate: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.replicate, int) or isinstance(self.replicate, bool) or self.replicate < 0:
            raise ConfigError(f"sweep spec: replicate must be 0 (the measurement) or a positive integer, got {self.replicate!r}")
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise ConfigError(f"sweep spec: chunk must be a positive integer, got {self.chunk!r}")
        if self.reference is not None and not Path(self.reference).expanduser().is_dir():
            raise ConfigError(f"sweep spec: reference must be an existing folder for the stored references, got {self.reference!r}; create it")
        if self.grid not in GRID_MODES:
            raise ConfigError(f"sweep spec: grid must be one of {', '.join(GRID_MODES)}, got {self.grid!r}")
        bad = [s for s in self.score if s not in ("all", "second-half")]
        if bad:
            raise ConfigError(f"sweep spec: unknown score {bad[0]!r}; use all or second-half")

    @classmethod
    def from_dict(cls, raw: dict) -> "SweepSpec":
        if not isinstance(raw, dict):
            raise ConfigError("a sweep spec must be a YAML mapping with keys such as models, weights, kv; see docs/sweeps.md")
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise ConfigError(f"sweep spec: unknown key(s) {unknown}; known: {', '.join(_KEYS)}")
        calibration = raw.get("calibration") or {}
        if not isinstance(calibration, dict):
            raise ConfigError("sweep spec: calibration must be a mapping such as {data: prose, samples: 16, length: 512}")
        stride = raw.get("stride")
        if stride is not None and (not isinstance(stride, int) or stride < 1):
            raise ConfigError(f"sweep spec: stride must be a positive integer, got {stride!r}")
        return cls(
            models=_strings(raw, "models", "default"),
            data=_strings(raw, "data", "default"),
            ctx=_ints(raw, "ctx", 1024),
            tokens=_ints(raw, "tokens", 8192),
            score=_strings(raw, "score", "all"),
            weights=tuple(_weight(w) for w in _list(raw, "weights", "none")),
            kv=tuple(_kv(k) for k in _list(raw, "kv", "fp16")),
            calibration=CalibrationSpec.from_dict(calibration),
            stride=stride,
            grid=str(raw.get("grid", "group")),
            name=str(raw.get("name", "sweep")),
            device=str(raw.get("device", "auto")),
            dtype=str(raw.get("dtype", "auto")),
            chunk=raw.get("chunk"),
            reference=None if raw.get("reference") is None else str(raw["reference"]),
            replicate=raw.get("replicate", 0),
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name, "models": list(self.models), "data": list(self.data), "ctx": list(self.ctx),
            "tokens": list(self.tokens), "score": list(self.score), "stride": self.stride,
            "weights": [w.to_dict() for w in self.weights], "kv": [k.to_dict() for k in self.kv],
            "calibration": self.calibration.to_dict(), "grid": self.grid,
            "device": self.device, "dtype": self.dtype, "chunk": self.chunk, "reference": self.reference,
            "replicate": self.replicate,
        }


def load_spec(path: str | Path) -> SweepSpec:
    """Read a sweep spec from a YAML (or JSON, a subset of YAML) file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep spec not found: {path}; write one as in docs/sweeps.md")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        raise ConfigError(f"{path} is not valid YAML{f' (line {where.line + 1})' if where else ''}; fix the spec") from None
    spec = SweepSpec.from_dict(raw)
    return spec if "name" in raw else SweepSpec(**{**spec.__dict__, "name": path.stem})
