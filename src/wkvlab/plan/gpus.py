"""GPU catalog: memory, bandwidth, peak dense tensor throughput per format.

The built-in catalog lives in ``data/gpus.yaml`` (with its sources); users add or override
entries with a YAML/JSON file of the same schema (``load_gpu_catalog(extra_file)``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin

TENSOR_FORMATS = ("bf16", "fp16", "fp8", "int8", "fp4")


@dataclass(frozen=True)
class GPU(JsonMixin):
    """One accelerator; ``tflops[f]`` is None where format ``f`` has no tensor-core path."""

    name: str
    memory_bytes: int
    bandwidth_gb_s: float
    tflops: dict[str, float | None]
    sm: int
    link_gb_s: float = 32.0  # GPU-to-GPU per direction (NVLink or PCIe), see data/gpus.yaml
    architecture: str = ""
    label: str = ""
    aliases: tuple[str, ...] = ()
    source: str = "built-in catalog"

    @property
    def native_formats(self) -> tuple[str, ...]:
        return tuple(f for f in TENSOR_FORMATS if self.tflops.get(f))

    def has_native(self, fmt: str) -> bool:
        return bool(self.tflops.get(fmt))

    def peak_flops(self, fmt: str) -> float:
        """Peak FLOP/s for ``fmt`` (falls back to bf16 where the format is not native)."""
        value = self.tflops.get(fmt) or self.tflops.get("bf16") or self.tflops.get("fp16")
        if not value:
            raise ConfigError(f"GPU {self.name} has no bf16/fp16 throughput; add it to the GPU file")
        return float(value) * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s * 1e9


def load_gpu_catalog(extra_file: str | Path | None = None) -> dict[str, GPU]:
    """The built-in catalog, updated by the entries of ``extra_file`` (YAML or JSON)."""
    text = resources.files("wkvlab.plan").joinpath("data/gpus.yaml").read_text()
    catalog = {g.name: g for g in _parse_entries(yaml.safe_load(text), "built-in catalog")}
    if extra_file is not None:
        path = Path(extra_file)
        if not path.is_file():
            raise ConfigError(f"GPU file {path} does not exist; pass a YAML/JSON file with a 'gpus' list")
        try:
            raw = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot parse GPU file {path} ({exc}); fix its syntax") from exc
        for gpu in _parse_entries(raw, f"GPU file {path}"):
            catalog[gpu.name] = gpu
    return catalog


def find_gpu(name: str | GPU, catalog: Mapping[str, GPU] | None = None) -> GPU:
    """Look a GPU up by name or alias, ignoring case and punctuation."""
    if isinstance(name, GPU):
        return name
    catalog = catalog if catalog is not None else load_gpu_catalog()
    key = _norm(name)
    for gpu in catalog.values():
        if key in {_norm(gpu.name), *(_norm(a) for a in gpu.aliases)}:
            return gpu
    raise ConfigError(f"unknown GPU {name!r}; use one of: {', '.join(catalog)} "
                      "or describe it in a file passed with --gpu-file")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _parse_entries(raw: Any, where: str) -> list[GPU]:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("gpus"), list):
        raise ConfigError(f"{where}: expected a top-level 'gpus' list of GPU entries")
    return [_parse_gpu(entry, where) for entry in raw["gpus"]]


def _parse_gpu(entry: Any, where: str) -> GPU:
    if not isinstance(entry, Mapping) or not entry.get("name"):
        raise ConfigError(f"{where}: every GPU entry needs a 'name'")
    name = str(entry["name"])
    try:
        if entry.get("memory_bytes") is not None:
            memory = int(entry["memory_bytes"])
        elif entry.get("memory_mib") is not None:
            memory = int(float(entry["memory_mib"]) * 2**20)
        elif entry.get("memory_gib") is not None:
            memory = int(float(entry["memory_gib"]) * 2**30)
        elif entry.get("memory_gb") is not None:
            memory = int(float(entry["memory_gb"]) * 10**9)
        else:
            raise ConfigError(f"{where}: GPU {name!r} needs memory_mib, memory_gib, memory_gb or memory_bytes")
        bandwidth = float(entry["bandwidth_gb_s"])
        tflops_raw = dict(entry.get("tflops") or {})
        tflops = {f: (float(tflops_raw[f]) if tflops_raw.get(f) is not None else None)
                  for f in TENSOR_FORMATS}
        sm = int(entry["sm"])
        link = float(entry.get("link_gb_s", 32.0))
    except KeyError as exc:
        raise ConfigError(f"{where}: GPU {name!r} lacks {exc.args[0]!r}; see data/gpus.yaml for the schema") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: GPU {name!r} has a non-numeric field ({exc}); fix the file") from None
    unknown = set(tflops_raw) - set(TENSOR_FORMATS)
    if unknown:
        raise ConfigError(f"{where}: GPU {name!r} lists unknown formats {sorted(unknown)}; "
                          f"use {TENSOR_FORMATS}")
    if memory <= 0 or bandwidth <= 0 or not (tflops["bf16"] or tflops["fp16"]):
        raise ConfigError(f"{where}: GPU {name!r} needs positive memory, bandwidth and bf16 TFLOP/s")
    if tflops["bf16"] is None:
        tflops["bf16"] = tflops["fp16"]
    return GPU(name=name, memory_bytes=memory, bandwidth_gb_s=bandwidth, tflops=tflops, sm=sm, link_gb_s=link,
               architecture=str(entry.get("architecture", "")), label=str(entry.get("label", "")),
               aliases=tuple(str(a) for a in entry.get("aliases", ())), source=where)
