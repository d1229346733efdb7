"""KV-cache quantization: formats, the spec, and the attention hook for teacher-forced passes."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("formats", "KV_FORMATS", "KVFormat", "get_kv_format"),
    **names("hook", "kv_quantization"),
    **names("spec", "KVSpec"),
}
__all__ = ["KV_FORMATS", "KVFormat", "get_kv_format", "kv_quantization", "KVSpec"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
