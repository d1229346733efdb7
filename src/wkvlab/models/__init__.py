"""Models: packaged defaults, loading (HF folders, GGUF) with a safetensors cache."""
from __future__ import annotations

from wkvlab.models.loading import LoadedModel, cache_dir, load_model
from wkvlab.models.packaged import PACKAGED_MODELS, packaged_gguf

__all__ = ["LoadedModel", "cache_dir", "load_model", "PACKAGED_MODELS", "packaged_gguf"]
