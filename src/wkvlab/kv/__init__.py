"""KV-cache quantization: formats, the spec, and the attention hook for teacher-forced passes."""
from __future__ import annotations

from wkvlab.kv.formats import KV_FORMATS, KVFormat, get_kv_format
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.spec import KVSpec

__all__ = ["KV_FORMATS", "KVFormat", "get_kv_format", "kv_quantization", "KVSpec"]
