"""Checkpoints made by other tools: the packaged GGUF files (Q4_1/Q8_0 and K-quants) and, where its
venv exists, llm-compressor's own compressed-tensors output; plus the export → eval command pair."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.weights import WeightSpec, quantize_model_weights

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _packaged_gguf(name: str) -> Path:
    from wkvlab.models.packaged import packaged_gguf

    return packaged_gguf(name)


@pytest.mark.slow
def test_packaged_gguf_as_candidate_is_the_reference_itself(default_model):
    # the reference IS this GGUF dequantized, so the candidate must be bit-identical: names, Q/K permutation, Q4_1/Q8_0 dequantization
    qw = quantize_model_weights(default_model.model, WeightSpec.parse(f"checkpoint:{_packaged_gguf('default')}"),
                                tokenizer=default_model.tokenizer)
    assert qw.lossless
    assert "GGUF (Q4_1" in qw.notes[0] and "Q8_0" in qw.notes[0]
    assert qw.weight_bytes < 0.4 * sum(p.numel() * 4 for p in default_model.model.parameters())


@pytest.mark.slow
def test_k_quant_gguf_against_a_different_reference_is_refused(default_model):
    from wkvlab.errors import ConfigError

    with pytest.raises(ConfigError, match="not a quantized copy of the reference model: model_type gemma3_text"):
        quantize_model_weights(default_model.model, WeightSpec.parse(f"checkpoint:{_packaged_gguf('gemma3-270m')}"))


@pytest.mark.slow
def test_k_quant_gguf_dequantizes_to_the_reference():
    from wkvlab.models.loading import load_model

    gemma = load_model("gemma3-270m")
    qw = quantize_model_weights(gemma.model, WeightSpec.parse(f"checkpoint:{_packaged_gguf('gemma3-270m')}"), tokenizer=gemma.tokenizer)
    assert qw.lossless and "Q4_K" in qw.notes[0] and "Q6_K" in qw.notes[0]


def _venv_python() -> Path | None:
    from wkvlab.models.loading import cache_dir

    home = Path(os.environ.get("WKVLAB_VENVS", Path.home() / ".cache" / "wkvlab" / "venvs"))
    for root in (home, cache_dir() / "venvs"):
        python = root / "llmcompressor-0.14.0.1" / "bin" / "python"
        if python.is_file():
            return python
    return None


@pytest.mark.slow
@pytest.mark.parametrize("method,symmetric", [("gptq", False), ("gptq", True), ("awq", True)])
def test_llmcompressor_output_reads_back_as_its_own_fake_quantization(tmp_path, method, symmetric):
    python = _venv_python()
    if python is None:
        pytest.skip("llm-compressor's venv is not there (benchmarks/peer_quantizers.py creates it)")
    from tests.weights.test_checkpoints import _tokenizer

    model = tiny_llama()
    model.save_pretrained(str(tmp_path / "model"))
    _tokenizer([f"t{i}" for i in range(128)]).save_pretrained(str(tmp_path / "model"))  # oneshot wants a processor
    tokens = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(0)).tolist()
    (tmp_path / "calib.json").write_text(json.dumps(tokens))
    command = [str(python), str(ROOT / "benchmarks" / "llmcompressor_side.py"), "--model-dir", str(tmp_path / "model"),
               "--calib-tokens", str(tmp_path / "calib.json"), "--method", method, "--group-size", "16",
               "--out", str(tmp_path / "ck"), "--dump-fake-quant"] + (["--symmetric"] if symmetric else [])
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    from safetensors.torch import load_file

    expected = load_file(str(tmp_path / "ck-fakequant.safetensors"))
    qw = quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'ck'}"))
    assert "compressed-tensors pack-quantized" in qw.notes[0]
    got = qw.model.state_dict()
    assert len(expected) == 14
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


@pytest.mark.slow
def test_export_then_eval_from_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    wkvlab = [sys.executable, "-m", "wkvlab.cli"]
    folder = tmp_path / "smollm2-w4a16"
    done = subprocess.run(wkvlab + ["export", "--model", "default", "--weights", "int4-g64-sym", "--out", str(folder)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and (folder / "tokenizer.json").is_file()
    done = subprocess.run(wkvlab + ["eval", "--model", "default", "--weights", f"checkpoint:{folder}", "--kv", "fp16,q4_0",
                                    "--ctx", "256", "--tokens", "512", "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert [r["kv"] for r in results] == ["fp16", "q4_0"]
    assert 0 < results[0]["kld"]["mean"] < results[1]["kld"]["mean"]
    printed = " ".join(done.stderr.split())  # rich wraps the note at the terminal width
    assert "compressed-tensors pack-quantized (int4 group 64 symmetric, 16-bit activations) × 210" in printed
