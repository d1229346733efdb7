"""Shared by every frozen spec dataclass that is read back from JSON/YAML."""
from __future__ import annotations

from dataclasses import fields

from wkvlab.errors import ConfigError


def reject_unknown_fields(cls: type, data: dict, what: str) -> None:
    """A typo in a spec file must fail loudly, naming the fields that exist, not be ignored."""
    if not isinstance(data, dict):
        raise ConfigError(f"a {what} must be a mapping of fields, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown {what} field(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
