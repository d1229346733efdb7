"""Start a real ``python -m llama_cpp.server`` on loopback for the end-to-end tests, and stop it."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(gguf: Path, log: Path, *, n_ctx: int, alias: str = "smollm2", extra: tuple[str, ...] = (),
                 start_timeout: float = 120) -> Iterator[str]:
    """Yields the server's base URL (``http://127.0.0.1:<port>/v1``) once ``/v1/models`` answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", str(n_ctx), "--n_threads", "2", "--n_threads_batch", "2", "--model_alias", alias, *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as r:
                    if json.loads(r.read())["data"]:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {start_timeout:.0f} s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
