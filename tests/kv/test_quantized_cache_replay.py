"""hf-quanto presets against transformers' own QuantizedCache (quanto backend), replayed on a tiny model.

optimum-quanto is not a wkvlab dependency, so the test builds its own venv under a temp dir that
sees this environment's packages (torch, transformers) through a .pth file and pip-installs only
optimum-quanto into it; without a reachable package index it skips, saying so. Slow (a venv and a
download): marked ``slow``.
"""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
QUANTO = "optimum-quanto==0.2.7"


@pytest.fixture(scope="module")
def quanto_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("quanto-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    lib = next((venv / "lib").glob("python3*")) / "site-packages"
    # this environment's packages (torch, transformers, pip) visible in the new venv, nothing installed into it
    (lib / "_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--target", str(lib), "-q", QUANTO],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"could not pip-install {QUANTO} into a temp venv (package index unreachable?): {proc.stderr.strip()[-300:]}")
    return str(py)


@pytest.mark.slow
@pytest.mark.parametrize("nbits", [4, 2])
def test_hf_quanto_preset_replays_quantized_cache(quanto_python, nbits):
    # prompt 13, residual 8, 40 decoded tokens: the prompt quantized at prefill, five flushes at 13 + 8m
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([quanto_python, str(ROOT / "tests" / "kv" / "_quantized_cache_replay.py"), str(nbits), "13", "8", "40"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["prompt_vs_ref"] < 1e-5  # the prompt attends unquantized, as QuantizedCache returns it
    assert result["quantized_effect"] > 1e-2  # the cache does change the decoded tokens' logits
    assert result["sim"] < 1e-5, result  # wkvlab's hf-quanto:int<b>+residual=8+prefill=13 is the same computation
    assert result["old"] > 100 * result["sim"]  # the previous preset (flushes counted from position 0) was not
