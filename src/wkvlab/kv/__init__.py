"""The KV cache: element formats, the spec, presets, and what the hooks do to a model.

``KVSpec`` and the formats import without torch (their byte counts and names are needed by the
planner and the parsers); the hooks that quantize a model's cache are imported on first use.
"""
from __future__ import annotations

from typing import Any

from wkvlab.kv.formats import KV_FORMATS, KVFormat, get_kv_format
from wkvlab.kv.spec import KVSpec

__all__ = ["KV_FORMATS", "KVFormat", "get_kv_format", "kv_quantization", "KVSpec"]


def __getattr__(name: str) -> Any:
    if name == "kv_quantization":
        from wkvlab.kv.hook import kv_quantization

        return kv_quantization
    raise AttributeError(f"module 'wkvlab.kv' has no attribute {name!r}")
