"""Where sweep results live: an SQLite file with every result, its config and its per-token arrays.

See docs/sweeps.md for the schema. The quantized-model disk cache is a separate, content-addressed
folder (:mod:`wkvlab.weights.cache`); reference passes are not cached (docs/sweeps.md says why).
"""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("db", "ResultStore", "StoredRow", "open_store"),
    **names("schema", "APPLICATION_ID", "SCHEMA_VERSION"),
}
__all__ = ["ResultStore", "StoredRow", "open_store", "APPLICATION_ID", "SCHEMA_VERSION"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
