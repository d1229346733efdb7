"""The report folder: refuse folders that are not ours, write every file atomically, drop stale files.

A report folder carries a manifest (``.wkvlab-report``, JSON: the files the last report wrote). A
folder that exists, holds anything, and has no manifest is someone else's — ``--out .`` or a typo
must never overwrite a user's files — so it is refused. Rewriting a report replaces its files one
atomic rename each and then removes the files the previous report wrote and this one did not.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from wkvlab.errors import ConfigError

MANIFEST = ".wkvlab-report"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is for sharing, like any file the user writes
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _previous_files(folder: Path) -> list[str]:
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [f for f in files if isinstance(f, str) and "/" not in f and f not in ("", ".", "..")]


def check_folder(folder: Path) -> None:
    """Refuse a file, or a non-empty folder that is not a wkvlab report (callers check before long work)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"report folder {folder} is a file; give a folder name such as {folder.with_suffix('')}-report")
    if folder.is_dir() and not (folder / MANIFEST).is_file() and any(folder.iterdir()):
        raise ConfigError(f"report folder {folder} already holds files that are not a wkvlab report; choose a new or empty folder")
    from wkvlab.preflight import folder_refusal  # tried, not read from mode bits (root ignores them)

    if not folder.exists():  # created later with its parents: the nearest existing one must take new folders
        ancestor = next(p for p in folder.absolute().parents if p.exists())
        if not ancestor.is_dir() or folder_refusal(ancestor) is not None:
            raise ConfigError(f"cannot create report folder {folder}: {ancestor} is not a writable folder; choose another --report/--out")
    elif (refusal := folder_refusal(folder)) is not None:
        raise ConfigError(f"report folder {folder} does not take new files ({refusal}); choose another --report/--out")


def prepare_folder(folder: Path) -> list[str]:
    """Check ``folder`` may receive a report (create it if missing); returns the previous report's files."""
    check_folder(folder)
    if folder.is_dir():
        return _previous_files(folder)
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise ConfigError(f"cannot create report folder {folder} ({exc.strerror}); choose a writable folder") from None
    return []


def write_folder(folder: Path, files: dict[str, bytes]) -> list[Path]:
    """Write a complete report (name → bytes) into a folder accepted by :func:`prepare_folder`."""
    previous = prepare_folder(folder)
    # The manifest goes first and lists old and new files, so an interrupted write leaves a folder
    # that is still recognisably ours and whose stale files the next run still cleans up.
    names = sorted(files)
    write_bytes_atomic(folder / MANIFEST, json.dumps({"files": sorted(set(names) | set(previous))}).encode())
    written = []
    for name in names:
        write_bytes_atomic(folder / name, files[name])
        written.append(folder / name)
    for stale in set(previous) - set(names):
        (folder / stale).unlink(missing_ok=True)
    write_bytes_atomic(folder / MANIFEST, json.dumps({"files": names}).encode())
    return written
