"""Statistics that compare configs evaluated on the same tokens (paired, resampled by window)."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("bootstrap", "Interval", "paired_interval", "unit_resampling_weights"),
}
__all__ = ["Interval", "paired_interval", "unit_resampling_weights"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
