"""Writing results: atomic, so an interrupted run never leaves half a file where a good one was."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from wkvlab.errors import ConfigError


def write_json_atomic(path: Path, payload: Any) -> None:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--json {path} is a folder; give a file name such as {path / 'results.json'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise ConfigError(f"folder {parent} does not exist; create it or choose another --json path")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
