"""What the two QuantizedCache replays share: a side venv holding the backend (optimum-quanto, hqq)
beside this environment's torch and transformers, the tiny model both replay on, and the decoding
loop transformers' generate runs (one prefill of the prompt, then one token per step).

The venv half runs under pytest; the model half runs inside that venv (the replay scripts import it
with the repository root on PYTHONPATH)."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def side_venv(tmp_path_factory, name: str, packages: tuple[str, ...], env: dict | None = None) -> str:
    """A venv with ``packages`` pip-installed (no deps) and this environment's packages visible;
    skips the test when the package index is unreachable. Nothing is installed into this environment."""
    import pytest

    venv = tmp_path_factory.mktemp(f"{name}-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    lib = next((venv / "lib").glob("python3*")) / "site-packages"
    # this environment's packages (torch, transformers, pip) visible in the new venv, nothing installed into it
    (lib / "_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--target", str(lib), "-q", *packages],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        pytest.skip(f"could not pip-install {' '.join(packages)} into a temp venv (package index unreachable?): {proc.stderr.strip()[-300:]}")
    return str(py)


def run_replay(python: str, script: str, *args: int) -> dict:
    """Run ``tests/kv/<script>`` in the side venv; its last stdout line is the JSON result."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([python, str(ROOT / "tests" / "kv" / script), *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tiny_model_and_tokens(prompt: int, steps: int):
    """The replays' model (eager attention, one KV head of 64) and token ids, seeded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, vocab_size=128, max_position_embeddings=256)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, prompt + steps), generator=torch.Generator().manual_seed(1))
    return model, ids


def decode(model, ids, prompt: int, cache):
    """Logits as generate computes them with ``cache``: the prompt in one pass, then token by token."""
    import torch

    out = model(ids[:, :prompt], past_key_values=cache, use_cache=True)
    logits = [out.logits[0]]
    for t in range(prompt, ids.shape[1]):
        out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits[0])
    return torch.cat(logits)
