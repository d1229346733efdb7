"""A llama-cpp-python OpenAI server on loopback, for engine-against-engine checks without a GPU.

    >>> with llama_cpp_server(packaged_gguf("default"), n_ctx=1024, cache="q4_0") as url:
    ...     api.evaluate_engines(api.ServerSpec(url=ref_url, ...), servers=[api.ServerSpec(url=url, ...)])

Starts ``python -m llama_cpp.server`` with the GGUF and cache type, waits until ``/v1/models``
answers, yields the base URL, and terminates the process on exit. Used by the end-to-end tests and
``benchmarks/engine_pair.py``; a real deployment serves its model its own way.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from wkvlab.engines.llamacpp import GGML_TYPES, flash_attention_on, import_llama_cpp, parse_cache_types
from wkvlab.errors import ModelError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_cpp_server(gguf: str | Path, *, n_ctx: int, cache: str = "f16", flash_attn: str = "auto", alias: str = "smollm2",
                     threads: int = 2, log: str | Path | None = None, start_timeout: float = 120) -> Iterator[str]:
    """Yields ``http://127.0.0.1:<port>/v1`` once the server answers; the cache as ``q4_0`` or ``q8_0/q4_0``."""
    import_llama_cpp()
    k, v = parse_cache_types(cache)
    flash = flash_attention_on(flash_attn, v)
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--model_alias", alias,
           "--type_k", str(GGML_TYPES[k]), "--type_v", str(GGML_TYPES[v]), "--flash_attn", "true" if flash else "false"]
    log_path = Path(log) if log is not None else None
    with (log_path.open("w") if log_path else open(os.devnull, "w")) as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    tail = lambda: log_path.read_text()[-2000:] if log_path else "(no log kept)"  # noqa: E731
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise ModelError(f"llama_cpp.server exited with {proc.returncode}: {tail()}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as r:
                    if json.loads(r.read())["data"]:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ModelError(f"llama_cpp.server did not answer within {start_timeout:.0f} s: {tail()}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
