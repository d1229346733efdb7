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
* ``fingerprints/``, ``selfgen/``, ``search-profiles/``, ``findings-search/`` — small files.

The run header states the root and the size of each part present (:func:`describe_cache`).
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "WKVLAB_CACHE"
WEIGHT_CACHE_ENV = "WKVLAB_WEIGHT_CACHE"  # "0": --no-weight-cache
_PARTS = {"quantized": "quantized weights", "kv-stats": "K/V statistics", "models": "model copies", "restore": "original weights"}


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


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def describe_cache() -> str:
    """``cache <root>: quantized weights 1.2 GiB, K/V statistics 3 MiB`` (or ``empty``), plus whether
    quantized weights are cached."""
    root = cache_dir()
    sizes = {label: _size(root / key) for key, label in _PARTS.items() if (root / key).is_dir()}
    parts = [f"{label} {_gib(size)}" for label, size in sizes.items() if size]
    state = "" if weight_cache_enabled() else "; quantized weights not cached (--no-weight-cache)"
    return f"cache {root}: {', '.join(parts) if parts else 'empty'}{state}"
