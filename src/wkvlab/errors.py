"""User-facing errors.

Anything a user can cause (a bad format name, a missing file, a context longer than the model
allows) raises a :class:`WkvlabError` whose message is one line that says what to do. The CLI
prints that line and exits non-zero; everything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class WkvlabError(Exception):
    """An error caused by the user's input; its message says how to fix it."""


class ConfigError(WkvlabError, ValueError):
    """A specification (format name, group size, spec file) that cannot be used."""


class DataError(WkvlabError):
    """Text or data that cannot be used (missing, empty, too short)."""


class ModelError(WkvlabError):
    """A model that cannot be loaded or is not a causal language model."""


class OutOfMemory(WkvlabError):
    """The device ran out of memory mid-run; ``results`` holds every configuration that had finished."""

    def __init__(self, message: str, results: list | None = None) -> None:
        super().__init__(message)
        self.results = list(results or [])
