"""Statistics that compare configs evaluated on the same tokens (paired over units, replicates pooled), and
the one rule that turns an interval into a verdict (:mod:`.decision`)."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("bootstrap", "Interval", "Resampled", "paired_interval", "pool", "resample"),
    **names("ratio", "window_ratio"),
    **names("decision", "Margin", "Effect", "Verdict", "decide", "DEFAULT_MARGIN"),
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
