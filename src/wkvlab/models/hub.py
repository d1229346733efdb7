"""Hugging Face model ids (``--model Qwen/Qwen2.5-0.5B``): the local Hugging Face cache first, the
hub only when it is reachable and allowed, otherwise one line saying what to do.

This is how vLLM, lm-eval and transformers users name models. An id is ``<org>/<name>`` that is not
an existing path (a folder ``org/name`` in the working directory wins). Resolution goes through
``huggingface_hub.snapshot_download``: with ``local_files_only=True`` it reads the cache's
``refs/main`` and returns ``snapshots/<commit>/`` without any network call; the cache is
``$HF_HUB_CACHE`` (else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), read per call so a
test's temporary cache is honoured. A download is attempted only when ``HF_HUB_OFFLINE`` is unset
and the hub answers a 1-second connection probe, so an offline machine gets one line at once
instead of huggingface_hub's retries. No torch here: the CLI resolves ids before anything loads.
"""
from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from wkvlab.errors import ModelError

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# What a model folder needs; weights in safetensors (or PyTorch bins for old repositories), no optimizer states.
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"]
_TRUE = {"1", "true", "yes", "on"}


def is_hub_id(spec: str) -> bool:
    """``org/name`` that names no existing file or folder (a missing ``dir/model.gguf`` is a missing file)."""
    key = spec.strip()
    return bool(_HUB_ID.match(key)) and not key.lower().endswith(".gguf") and not Path(key).expanduser().exists()


def hf_home() -> str:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface`` (read per call)."""
    return os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")


def hub_cache() -> str:
    """The hub cache folder huggingface_hub would use now (environment read per call)."""
    return os.environ.get("HF_HUB_CACHE") or os.path.join(hf_home(), "hub")


def hub_unreachable(timeout: float = 1.0) -> str | None:
    """Why the hub cannot be used now (``HF_HUB_OFFLINE`` set, or no TCP connection within
    ``timeout``), or None. The probe runs in a thread because name resolution ignores socket timeouts."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return f"{name} is set"
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    answer: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)
    return None if answer and answer[0] else f"{host} is not reachable"


def cached_snapshot(spec: str) -> Path | None:
    """The id's snapshot folder in the local cache (no network), or None."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # a dependency of transformers; absent only in a broken install
        return None
    try:
        folder = Path(snapshot_download(spec.strip(), cache_dir=hub_cache(), local_files_only=True))
    except Exception:  # LocalEntryNotFoundError and friends: not cached
        return None
    return folder if (folder / "config.json").is_file() else None


def resolve_hub_model(spec: str, download: bool = True) -> Path:
    """The local folder of the model ``spec`` names (an ``org/name`` id): cached, or downloaded when
    ``download`` and the hub is reachable; else a one-line :class:`ModelError` saying what to do."""
    folder = cached_snapshot(spec)
    if folder is not None:
        return folder
    spec = spec.strip()
    why = hub_unreachable()
    where = f"the local Hugging Face cache ({hub_cache()})"
    if why is not None or not download:
        raise ModelError(f"model {spec!r} is not in {where} and {why or 'downloading is off'}; run 'hf download {spec}' where the hub is "
                         f"reachable (or point HF_HUB_CACHE at a cache holding it), or pass a .gguf file or a model folder")
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec, cache_dir=hub_cache(), allow_patterns=MODEL_FILES))
    except Exception as exc:  # gated, missing, network: one line
        raise ModelError(f"could not download {spec!r} from the Hugging Face hub ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
                         "check the id (org/name), 'hf auth login' for gated models, or pass a local folder") from None
    if not (folder / "config.json").is_file():
        raise ModelError(f"{spec!r} on the Hugging Face hub has no config.json; pass a transformers model id, a .gguf file or a folder")
    return folder
