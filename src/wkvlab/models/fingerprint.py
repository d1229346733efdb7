"""What identifies a model's weights: a SHA-256 of their content, computed once per file version.

Everything wkvlab caches per model — quantized weights, K/V statistics, stored references, sweep
ids — is keyed by this fingerprint, so two models may share it only when their weights are the
same bytes. (It used to hash file names and sizes: a fine-tune with the same config has the same
sizes, and would have reused the base model's cached GPTQ weights and statistics.)

A folder's fingerprint hashes, in name order, each file's name and the SHA-256 of its content;
a GGUF's is the SHA-256 of the file. Hashing reads every byte once (about a second per GB); the
result is kept under the wkvlab cache (``fingerprints/``) keyed by the file's path, size, inode,
mtime and ctime, so a later run pays nothing until the file changes — a rewrite, even one of the
same size, changes its ctime.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_BLOCK = 1 << 23  # 8 MiB reads


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _memo_file(path: Path) -> Path:
    from wkvlab.models.cache import cache_dir  # not models.loading: that imports torch

    return cache_dir() / "fingerprints" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32] + ".json")


def file_sha256(path: Path) -> str:
    """SHA-256 of ``path``'s content, read from the memo when the file has not changed since."""
    path = Path(path)
    key = _stat_key(path)
    memo = _memo_file(path)
    try:
        stored = json.loads(memo.read_text())
        if stored.get("key") == key:
            return stored["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    value = digest.hexdigest()
    try:  # best effort: a read-only cache only costs the next run the hash again
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "sha256": value}))
        os.replace(tmp, memo)
    except OSError:
        pass
    return value


def folder_fingerprint(folder: Path) -> str:
    """SHA-256 over every file of a Hugging Face folder: its name and its content's SHA-256."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            digest.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return digest.hexdigest()
