"""Writing results: atomic, so an interrupted run never leaves half a file where a good one was."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from wkvlab.preflight import check_output_file  # the output-path check lives with the other checks

__all__ = ["check_output_file", "json_safe", "write_json_atomic"]


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
