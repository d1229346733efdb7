"""One unit convention for sizes: binary prefixes. Weights and memory are MiB (2^20 bytes) or GiB
(2^30 bytes) in every table, chart and report; KV caches are bytes per token. (The planner also
prints GB = 10^9 bytes beside GiB, labelled, because GPU datasheets use GB.)"""
from __future__ import annotations

MIB = 2**20
GIB = 2**30


def mib(n_bytes: float) -> str:
    """``n_bytes`` in MiB with one decimal and thousands separators, no unit (the column says it)."""
    return f"{n_bytes / MIB:,.1f}"
