"""Evaluation: reference and candidate runs, per-token metrics, results."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("result", "EvalResult", "TokenArrays"),
    **names("runner", "run_grid"),
}
__all__ = ["EvalResult", "TokenArrays", "run_grid"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
