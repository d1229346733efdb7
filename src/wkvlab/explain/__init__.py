"""Explain where combined weight × KV-cache quantization error comes from (issue #5).

    >>> from wkvlab.explain import explain
    >>> report = explain("int4-g128", "int4", model="default", ctx=512, tokens=2048)
    >>> report.factorial.kld.interaction, report.verdict

See docs/explain.md. ``explain`` is imported on first use: the submodules (attention, hidden, ...)
import this package, and loading the whole pipeline for each of them would be wasted work.
"""
from __future__ import annotations

__all__ = ["explain", "ExplainReport", "ExplainOptions"]


def __getattr__(name: str):
    if name in __all__:
        from wkvlab.explain import run

        return getattr(run, name)
    raise AttributeError(f"module 'wkvlab.explain' has no attribute {name!r}")
