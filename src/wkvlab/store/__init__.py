"""Where sweep results live: an SQLite file with every result, its config and its per-token arrays.

See docs/sweeps.md for the schema. The quantized-model disk cache is a separate, content-addressed
folder (:mod:`wkvlab.weights.cache`); reference passes are not cached (docs/sweeps.md says why).
"""
from wkvlab.store.db import ResultStore, StoredRow, open_store
from wkvlab.store.schema import APPLICATION_ID, SCHEMA_VERSION

__all__ = ["ResultStore", "StoredRow", "open_store", "APPLICATION_ID", "SCHEMA_VERSION"]
