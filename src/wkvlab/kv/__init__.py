"""The KV cache: element formats, the spec, presets, and what the hooks do to a model.

``KVSpec`` and the formats import without torch (their byte counts and names are needed by the
planner and the parsers); the hooks that quantize a model's cache are imported on first use.
"""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("formats", "KV_FORMATS", "KVFormat", "get_kv_format"),
    **names("hook", "kv_quantization"),
    **names("spec", "KVSpec"),
}
__all__ = ["KV_FORMATS", "KVFormat", "get_kv_format", "kv_quantization", "KVSpec"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
