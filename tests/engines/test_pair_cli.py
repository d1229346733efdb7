"""``wkvlab engine eval`` with an engine reference: bad combinations are one line, before anything loads."""
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, message", [
    (["--reference-url", "http://127.0.0.1:9/v1", "--reference-gguf", "default"], "give one reference engine"),
    (["--kv", "f16,q4_0"], "several candidates (--kv a,b or several --url) are compared in one run against an engine reference"),
    (["--engine", "openai", "--url", "http://a:1/v1", "--url", "http://b:1/v1", "--model", "x,y,z", "--reference-url", "http://c:1/v1"],
     "give one --model for all 2 --url, or one per --url (got 3)"),
    (["--reference-gguf", "default", "--reference", "default"], "--reference names the transformers reference"),
    (["--reference-gguf", "default", "--kv", "f16,q9_9"], "unknown KV format 'q9_9'"),
])
def test_bad_engine_reference_options_are_one_line(args, message):
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "engine", "eval", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
