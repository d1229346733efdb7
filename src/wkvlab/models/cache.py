"""Where wkvlab keeps what it computes once per model, and how much is there (no torch).

The root is ``--cache-dir`` (every computing command), else ``$WKVLAB_CACHE``, else
``~/.cache/wkvlab``. What lives under it, by folder:

* ``quantized/`` — calibrated weight builds (GPTQ, AWQ, SmoothQuant, static activation scales):
  the tensors they changed, about the size of the decoder's weights per config (13 GiB for an
  8B model in bf16 after GPTQ). ``--no-weight-cache`` neither reads nor writes them.
* ``kv-stats/`` — calibrated K/V statistics, kilobytes to megabytes each;
* ``models/`` — safetensors copies of dequantized GGUF files (their size in float32);
* ``restore/`` — the original weights of a CPU model while the one-model plan builds configs in
  place; removed when the run ends;
* ``fingerprints/``, ``selfgen/``, ``search-profiles/``, ``findings-search/``, ``findings-depth/`` — small files.

The run header states the root and the size of each part present (:func:`describe_cache`), what the
run may add (:mod:`wkvlab.models.cache_writes`), and a warning past ``$WKVLAB_CACHE_WARN_GIB``.
``wkvlab cache list`` / ``prune`` (:mod:`wkvlab.models.cache_entries`) show and trim it.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "WKVLAB_CACHE"
WEIGHT_CACHE_ENV = "WKVLAB_WEIGHT_CACHE"  # "0": --no-weight-cache
WARN_ENV = "WKVLAB_CACHE_WARN_GIB"  # the size past which every run's header warns (0: never)
DEFAULT_WARN_GIB = 20.0
LOCK_NAME = ".lock"  # runs hold it shared, 'wkvlab cache prune' exclusively (wkvlab.models.cache_entries)
PARTS = {"quantized": "calibrated weight builds", "kv-stats": "K/V statistics", "models": "model copies", "restore": "original weights",
         "fingerprints": "fingerprints", "selfgen": "generated text", "search-profiles": "search profiles",
         "findings-search": "findings searches", "findings-depth": "findings depth lengths"}
_HEADER_PARTS = ("quantized", "kv-stats", "models", "restore")  # the big ones, named in the run header
_held: list = []  # the open lock file of this process (kept open: the lock lives as long as the run)


def cache_dir() -> Path:
    """Root of wkvlab's on-disk cache (``$WKVLAB_CACHE`` or ``~/.cache/wkvlab``)."""
    root = os.environ.get(ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "wkvlab"


def weight_cache_enabled() -> bool:
    """False under ``--no-weight-cache``: calibrated weight builds are neither read nor written."""
    return os.environ.get(WEIGHT_CACHE_ENV, "1") != "0"


def use_cache(folder: Path | None, weights: bool) -> None:
    """Apply ``--cache-dir`` / ``--no-weight-cache`` to this process (and the workers it starts)."""
    if folder is not None:
        os.environ[ENV] = str(Path(folder).expanduser().resolve())
    if not weights:
        os.environ[WEIGHT_CACHE_ENV] = "0"


def cache_env() -> dict[str, str]:
    """The variables that carry ``--cache-dir`` / ``--no-weight-cache`` to worker processes (Ray actors)."""
    return {k: os.environ[k] for k in (ENV, WEIGHT_CACHE_ENV) if k in os.environ}


def size_of(path: Path) -> int:
    """Bytes under ``path`` (a file, or a folder walked without following links)."""
    if not path.is_dir() or path.is_symlink():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def gib(n: float) -> str:
    if n < 2**10:
        return f"{n:.0f} B"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def mark_used(path: Path) -> None:
    """Record that a cache entry was just read (its mtime: what 'wkvlab cache' calls last use, and
    what prune's least-recently-used order reads); best effort on a read-only cache."""
    try:
        os.utime(path)
    except OSError:
        pass


def hold_cache() -> None:
    """Hold a shared lock on the cache for the rest of this process, so 'wkvlab cache prune' keeps
    what this run may be writing or reading. Only an existing root is locked: creating it here
    would leave a folder behind a run that writes nothing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no advisory locks; prune then relies on temporary names and last use
        return
    root = cache_dir()
    if _held or not root.is_dir():
        return
    try:
        handle = (root / LOCK_NAME).open("a")
        fcntl.flock(handle, fcntl.LOCK_SH)  # waits only while a prune runs
    except OSError:  # a read-only cache: nothing this run writes there to protect
        return
    _held.append(handle)


def warn_gib() -> float:
    try:
        return max(0.0, float(os.environ.get(WARN_ENV, DEFAULT_WARN_GIB)))
    except ValueError:
        return DEFAULT_WARN_GIB


def describe_cache() -> tuple[str, str | None]:
    """(``cache <root>: calibrated weight builds 1.2 GiB, K/V statistics 3 MiB`` (or ``empty``) and
    whether quantized weights are cached; the one-line warning when the whole cache is larger than
    ``$WKVLAB_CACHE_WARN_GIB`` (default 20), else None)."""
    root = cache_dir()
    sizes = {key: size_of(root / key) for key in PARTS if (root / key).is_dir()} if root.is_dir() else {}
    parts = [f"{PARTS[key]} {gib(size)}" for key, size in sizes.items() if size and key in _HEADER_PARTS]
    state = "" if weight_cache_enabled() else "; quantized weights not cached (--no-weight-cache)"
    total, limit = sum(sizes.values()), warn_gib()
    warning = None
    if limit and total > limit * 2**30:
        warning = (f"the cache {root} holds {gib(total)}, over {limit:g} GiB (${WARN_ENV}); 'wkvlab cache list' shows what, "
                   f"'wkvlab cache prune --older-than 7d' or '--max-size {max(1, int(limit // 2))}G' frees space")
    return f"cache {root}: {', '.join(parts) if parts else 'empty'}{state}", warning
