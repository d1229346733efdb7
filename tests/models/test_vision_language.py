"""Vision-language checkpoints evaluate their text decoder (Qwen2-VL, Qwen2.5-VL, Mistral 3, Llama 4),
with weight and KV quantization actually applied; --attn; the dtype results are headed with."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.models.tiny_folders import save_folder, tiny_llama4, tiny_mistral3, tiny_qwen2_vl, tiny_qwen25_vl, word_text
from wkvlab import api
from wkvlab.errors import ConfigError
from wkvlab.models.loading import load_model

MAKERS = {"qwen2_vl": tiny_qwen2_vl, "qwen2_5_vl": tiny_qwen25_vl, "mistral3": tiny_mistral3, "llama4": tiny_llama4}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    made = {name: save_folder(make(), root / name) for name, make in MAKERS.items()}
    made["text"] = word_text(root / "text.txt")
    return made


@pytest.mark.parametrize("name, loads_as", [("qwen2_vl", "Qwen2VLForConditionalGeneration"),
                                            ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
                                            ("mistral3", "Mistral3ForConditionalGeneration"),
                                            ("llama4", "Llama4ForCausalLM")])
def test_each_layout_loads_with_its_weights(folders, name, loads_as):
    loaded = load_model(str(folders[name]))
    assert type(loaded.model).__name__ == loads_as
    original = MAKERS[name]()  # same seed: the folder's weights
    want = original.language_model.state_dict() if name == "llama4" else original.state_dict()
    got = loaded.model.state_dict()
    assert set(want) == set(got)
    assert all(torch.equal(want[k], got[k]) for k in want)


def _by_config(results):
    return {(r.weights, r.kv): r for r in results}


@pytest.mark.parametrize("name", ["qwen2_vl", "mistral3"])
def test_api_evaluates_the_text_decoder_with_both_quantizers_firing(folders, name):
    results = _by_config(api.evaluate(str(folders[name]), str(folders["text"]), ctx=64, tokens=128, weights=["none", "int4-g32"],
                                      kv=["fp16", "q4_0"], device="cpu"))
    assert results[("none", "fp16")].kld["mean"] == 0.0  # the reference against itself
    assert results[("none", "q4_0")].kld["mean"] > 1e-6  # the KV hook changed the decoder's attention
    assert results[("int4-g32", "fp16")].kld["mean"] > 1e-5  # the weights were rounded
    assert results[("int4-g32", "fp16")].quantized_fraction == 1.0  # every decoder linear, no vision layer counted


def test_llama4_takes_kv_configs_and_refuses_weights_on_its_fused_experts(folders):
    results = _by_config(api.evaluate(str(folders["llama4"]), str(folders["text"]), ctx=64, tokens=128, kv=["fp16", "q4_0"], device="cpu"))
    assert results[("none", "q4_0")].kld["mean"] > 1e-6
    with pytest.raises(ConfigError, match="Llama4TextExperts"):
        api.evaluate(str(folders["llama4"]), str(folders["text"]), ctx=64, tokens=128, weights=["int4-g32"], device="cpu")


def test_cli_eval_on_qwen25_vl_folder(folders, tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "wkvlab.cli", "eval", "--model", str(folders["qwen2_5_vl"]), "--data", str(folders["text"]),
                          "--ctx", "64", "--tokens", "128", "--weights", "int4-g32", "--kv", "fp16,q4_0", "--device", "cpu", "--attn", "eager",
                          "--cache-dir", str(tmp_path / "cache"), "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "model: Qwen2_5_VLForConditionalGeneration on cpu, float32, eager attention" in run.stderr
    kld = {r["kv"]: r["kld"]["mean"] for r in json.loads(out.read_text())}
    assert kld["q4_0"] > kld["fp16"] > 1e-5  # weights alone, then weights and cache


def test_attn_choice_reaches_the_model(folders):
    assert load_model(str(folders["mistral3"]), attn="eager").model.config._attn_implementation == "eager"
    assert load_model(str(folders["mistral3"]), attn="sdpa").model.config._attn_implementation == "sdpa"


def test_flash_attention_refusals(monkeypatch):
    import importlib.util

    from wkvlab.kv.spec import KVSpec
    from wkvlab.models import attn

    with pytest.raises(ConfigError, match="unknown --attn 'flash'"):
        attn.check_attn("flash")
    assert attn.check_attn("auto") is None and attn.check_attn("Eager") == "eager"
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="flash-attn package is not installed"):
            attn.check_attn("flash_attention_2", device="cuda")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError, match="runs on CUDA only"):
        attn.check_attn("flash_attention_2", device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="this run is float32"):
        attn.check_attn("flash_attention_2", device="cuda", dtype="float32")
    with pytest.raises(ConfigError, match=r"llamacpp:q8_0: llamacpp reads dequantized K/V in float32 .* flash kernels take 16-bit"):
        attn.check_attn("flash_attention_2", device="cuda", kv_specs=[KVSpec.parse("llamacpp:q8_0")])
    assert attn.check_attn("flash_attention_2", device="cuda", kv_specs=[KVSpec.parse("q8_0"), KVSpec.parse("fp8_e4m3")]) == "flash_attention_2"


def test_cli_refuses_attn_and_device_map_in_one_line_before_loading(folders):
    for flag, value, message in (("--attn", "flash", "unknown --attn 'flash'"), ("--device-map", "offload", "unknown --device-map 'offload'")):
        run = subprocess.run([sys.executable, "-m", "wkvlab.cli", "eval", "--model", str(folders["mistral3"]), "--ctx", "64", "--tokens", "128",
                              "--kv", "q4_0", flag, value], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2
        assert run.stderr.strip().splitlines() == [f"error: {message}; use one of " + ("auto, sdpa, eager, flash_attention_2" if flag == "--attn"
                                                                                          else "auto, balanced, sequential")]


def test_api_defaults_to_the_device_the_cli_uses():
    import inspect

    for function in (api.evaluate, api.prepare):
        assert inspect.signature(function).parameters["device"].default == "auto"


def test_results_name_the_compute_dtype(folders):
    from wkvlab.eval.baseline import FLOAT_LABEL, float_baseline

    results = api.evaluate(str(folders["mistral3"]), str(folders["text"]), ctx=64, tokens=128, kv=["q4_0"], device="cpu", dtype="bfloat16")
    assert results[0].fidelity["baseline"]["label"] == "the float reference (bfloat16 activations, 16-bit cache)"
    assert results[0].run["dtype"] == "bfloat16"
    assert float_baseline(torch.nn.Linear(2, 2)).label == FLOAT_LABEL == "the float reference (float32 activations, 16-bit cache)"
