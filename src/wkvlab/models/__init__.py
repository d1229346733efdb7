"""Models: the packaged ones located without network access (:mod:`.packaged`), loading (:mod:`.loading`).

Locating a packaged model needs no torch (the planner describes it from its GGUF header); loading
is imported on first use (PEP 562).
"""
from __future__ import annotations

from typing import Any

from wkvlab.models.packaged import PACKAGED_MODELS, packaged_gguf

__all__ = ["LoadedModel", "cache_dir", "load_model", "PACKAGED_MODELS", "packaged_gguf"]


def __getattr__(name: str) -> Any:
    if name in ("LoadedModel", "cache_dir", "load_model"):
        from wkvlab.models import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'wkvlab.models' has no attribute {name!r}")
