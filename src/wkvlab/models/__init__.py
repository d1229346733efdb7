"""Models: the packaged ones located without network access (:mod:`.packaged`), loading (:mod:`.loading`).

Locating a packaged model needs no torch (the planner describes it from its GGUF header); loading
is imported on first use (PEP 562).
"""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("loading", "LoadedModel", "cache_dir", "load_model"),
    **names("packaged", "PACKAGED_MODELS", "packaged_gguf"),
}
__all__ = ["LoadedModel", "cache_dir", "load_model", "PACKAGED_MODELS", "packaged_gguf"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
