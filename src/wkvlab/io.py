"""Writing results: atomic, so an interrupted run never leaves half a file where a good one was."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from wkvlab.errors import ConfigError


def json_safe(value: Any) -> Any:
    """NaN and ±inf as null: json.dump writes them as bare NaN/Infinity, which strict parsers
    (jq, JavaScript's JSON.parse) refuse. A ratio with a zero denominator is 'undefined', not a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def check_output_file(path: Path | None, option: str = "--json", suffixes: tuple[str, ...] = ()) -> None:
    """Refuse an output file that could not be written, before the work that produces it.

    Nothing is created: the folder must exist and be writable, the path must not be a folder, and
    (with ``suffixes``) the name must end in one of them. Writing is still atomic and re-checked.
    """
    if path is None:
        return
    path = Path(path)
    example = f"results{suffixes[0] if suffixes else '.json'}"
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder; give a file name such as {path / example}")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: use a file name ending in {' or '.join(suffixes)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"folder {parent} does not exist; create it or choose another {option} path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"folder {parent} is not writable; choose another {option} path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path} exists and is not writable; choose another path")


def write_json_atomic(path: Path, payload: Any, option: str = "--json") -> None:
    path = Path(path)
    check_output_file(path, option)
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(json_safe(payload), handle, indent=2, allow_nan=False)
            handle.write("\n")
        # mkstemp creates the file 0600; a results file should be as readable as any file the user writes.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
