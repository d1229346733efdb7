"""wkvlab: measure, explain and plan the combined quantization of LLM weights and KV cache."""
from __future__ import annotations

__version__ = "0.1.0"
