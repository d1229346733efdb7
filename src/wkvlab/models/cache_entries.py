"""What is in wkvlab's disk cache, entry by entry, and pruning it (no torch).

An *entry* is one child of a part folder (:data:`wkvlab.models.cache.PARTS`): a model copy, a
calibrated weight build, a K/V statistics file, a fingerprint memo... Its size is what it holds on
disk; its last use is its modification time, which every reader of a model copy, weight build or
K/V statistics file refreshes (:func:`wkvlab.models.cache.mark_used`).

Entries are written to a temporary name and renamed into place (``<name>.<random>`` folders,
``*.tmp`` files), so an entry with such a name is one being written — or left by a killed run.
Pruning never touches one while any run might still write it: each computing command holds a
shared lock on ``<root>/.lock`` for its lifetime (:func:`wkvlab.models.cache.hold_cache`); prune
takes it exclusively when it can, and when a run holds it keeps partial entries, ``restore/``
(a live run's original weights) and anything used in the last hour. An entry is deleted by first
renaming it aside (one atomic step: a reader sees it whole or not at all), then removing it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from wkvlab.errors import ConfigError
from wkvlab.models.cache import LOCK_NAME, PARTS, cache_dir, size_of

RECENT_SECONDS = 3600  # while a run holds the cache, entries used this recently are kept
STALE_SECONDS = 86400  # a partial entry older than this, with no run holding the cache, is a killed run's leftover
_TRASH = ".pruning-"


@dataclass(frozen=True)
class Entry:
    part: str  # the folder under the root: quantized, kv-stats, models, ...
    path: Path
    size: int
    last_used: float  # seconds since the epoch
    model: str  # the model's fingerprint (or '' when the entry does not say)
    partial: bool  # being written, or left half-written by a killed run

    @property
    def kind(self) -> str:
        return PARTS.get(self.part, self.part)


def _partial(part: str, path: Path) -> bool:
    name = path.name
    if name.startswith(_TRASH) or name.endswith(".tmp"):
        return True
    # mkdtemp(prefix=target.name + ".") beside the target: final names are hex keys without a dot
    return part in ("models", "quantized") and path.is_dir() and "." in name


def _safetensors_metadata(path: Path) -> dict:
    """The ``__metadata__`` of a safetensors file, from its JSON header (no torch)."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 1 << 26:
                return {}
            return json.loads(handle.read(length)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error):
        return {}


def _model_of(part: str, path: Path) -> str:
    """The fingerprint (or its first 16 hex digits, for model copies) of the model an entry belongs to."""
    try:
        if part == "models":
            return path.name.split("-")[0]
        if part == "quantized":
            return str(json.loads((path / "meta.json").read_text()).get("model", ""))
        if part == "kv-stats":
            source = json.loads(_safetensors_metadata(path).get("source", "{}"))
            return str(source.get("key", "")).split("|")[0]
    except (OSError, ValueError, AttributeError):
        pass
    return ""


def list_entries(root: Path | None = None) -> list[Entry]:
    """Every entry under the cache root, least recently used first."""
    root = cache_dir() if root is None else root
    entries = []
    if not root.is_dir():
        return entries
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(folder.iterdir()):
            try:
                used = path.lstat().st_mtime
            except OSError:  # removed meanwhile
                continue
            entries.append(Entry(folder.name, path, size_of(path), used, _model_of(folder.name, path), _partial(folder.name, path)))
    return sorted(entries, key=lambda e: e.last_used)


def model_names(root: Path | None = None) -> dict[str, str]:
    """Fingerprint → the file or folder it was computed from, as the fingerprint memos recorded
    them (a folder's fingerprint is rebuilt from its files' memos, as
    :func:`wkvlab.models.fingerprint.folder_fingerprint` computes it)."""
    root = cache_dir() if root is None else root
    files: dict[Path, str] = {}
    for memo in (root / "fingerprints").glob("*.json"):
        try:
            stored = json.loads(memo.read_text())
            files[Path(stored["key"]["path"])] = stored["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    names = {sha: str(path) for path, sha in files.items()}
    folders: dict[Path, list[Path]] = {}
    for path in files:
        folders.setdefault(path.parent, []).append(path)
    for folder, members in folders.items():
        digest = hashlib.sha256()
        for path in sorted(members, key=lambda p: p.name):
            digest.update(f"{path.name}:{files[path]}\n".encode())
        names.setdefault(digest.hexdigest(), str(folder))
    return names


def describe_model(fingerprint: str, names: dict[str, str]) -> str:
    if not fingerprint:
        return "?"
    for sha, name in names.items():
        if sha.startswith(fingerprint):
            return Path(name).name
    return fingerprint[:12]


def model_fingerprint(spec: str) -> str | None:
    """The fingerprint of the model ``spec`` names when its files are here (None otherwise)."""
    from wkvlab.models.facts import _existing_file
    from wkvlab.models.fingerprint import file_sha256, folder_fingerprint

    source = _existing_file(spec)
    if source is None:
        return None
    return folder_fingerprint(source) if source.is_dir() else file_sha256(source)


def _matches(entry: Entry, model: str, fingerprint: str | None, names: dict[str, str]) -> bool:
    if fingerprint and entry.model and fingerprint.startswith(entry.model):
        return True
    return bool(entry.model) and model.lower() in describe_model(entry.model, names).lower()


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20, "g": 2**30, "gb": 2**30,
          "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}
_SPANS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, option: str = "--max-size") -> int:
    """``2G``, ``500M``, ``1.5GiB``, ``0`` → bytes (powers of 1024, as every size wkvlab prints)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{option} {text!r}: give a size such as 2G, 500M or 1.5GiB")
    try:
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    except ValueError:
        raise ConfigError(f"{option} {text!r}: give a size such as 2G, 500M or 1.5GiB") from None


def parse_age(text: str, option: str = "--older-than") -> float:
    """``7d``, ``12h``, ``30m``, ``2w`` → seconds."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-z]+)\s*", text.lower())
    if not match or match.group(2) not in _SPANS:
        raise ConfigError(f"{option} {text!r}: give an age such as 7d, 12h, 30m or 2w")
    try:
        return float(match.group(1)) * _SPANS[match.group(2)]
    except ValueError:
        raise ConfigError(f"{option} {text!r}: give an age such as 7d, 12h, 30m or 2w") from None


@dataclass(frozen=True)
class PrunePlan:
    remove: tuple[Entry, ...]
    kept_in_use: tuple[Entry, ...]  # candidates kept because a run may be writing or reading them
    total: int  # bytes in the cache before
    busy: bool  # a run held the cache lock

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.remove)


def plan_prune(entries: list[Entry], *, older_than: float | None = None, max_size: int | None = None, model: str | None = None,
               busy: bool = False, now: float | None = None, names: dict[str, str] | None = None,
               fingerprint: str | None = None) -> PrunePlan:
    """What :func:`prune` removes: entries unused for ``older_than`` seconds, then least recently
    used first until the cache holds at most ``max_size`` bytes; only ``model``'s entries when it
    is given (alone: all of them). Partial entries, and while ``busy`` recent ones and ``restore/``,
    are never candidates (a killed run's partial entries are, after :data:`STALE_SECONDS` idle)."""
    if older_than is None and max_size is None and model is None:
        raise ConfigError("give --older-than (e.g. 7d), --max-size (e.g. 2G) or --model NAME; 'wkvlab cache list' shows what is cached")
    now = time.time() if now is None else now
    names = names or {}
    total = sum(e.size for e in entries)

    def protected(e: Entry) -> bool:
        if e.partial:
            return busy or now - e.last_used < STALE_SECONDS
        return busy and (e.part == "restore" or now - e.last_used < RECENT_SECONDS)

    chosen = [e for e in entries if model is None or _matches(e, model, fingerprint, names)]
    kept = [e for e in chosen if protected(e)]
    candidates = [e for e in chosen if not protected(e)]  # least recently used first (list_entries' order)
    if older_than is None and max_size is None:
        return PrunePlan(tuple(candidates), tuple(kept), total, busy)
    remove = [e for e in candidates if older_than is not None and now - e.last_used >= older_than]
    if max_size is not None:
        left = total - sum(e.size for e in remove)
        for e in candidates:
            if left <= max_size:
                break
            if e not in remove:
                remove.append(e)
                left -= e.size
    stale = [e for e in entries if e.partial and not protected(e) and e not in remove and model is None]
    return PrunePlan(tuple(remove + stale), tuple(kept), total, busy)


def remove_entry(entry: Entry) -> None:
    """Rename aside (atomic: a reader finds the entry whole or absent), then delete."""
    aside = entry.path.with_name(f"{_TRASH}{os.getpid()}-{entry.path.name}")
    try:
        os.replace(entry.path, aside)
    except FileNotFoundError:
        return
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


@contextmanager
def pruning_lock(root: Path | None = None) -> Iterator[bool]:
    """Hold ``<root>/.lock`` exclusively while pruning when no run holds it (runs starting meanwhile
    wait the moment it takes); yields whether a run holds it (then prune keeps what it may use)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: assume a run may be active (keep partial, recent and restore/ entries)
        yield True
        return
    lock = (cache_dir() if root is None else root) / LOCK_NAME
    if not lock.parent.is_dir():
        yield False
        return
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield True
            return
        try:
            yield False
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
