"""Models users bring: MoE and multimodal folders through the CLI, Gemma 2, offloaded layers, and
fingerprints from weight content."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import tiny_llama
from tests.models.tiny_folders import (save_folder, tiny_gemma3_multimodal, tiny_llama4, tiny_mistral3, tiny_mixtral, tiny_qwen3_moe,
                                       tiny_qwen25_vl, word_text)
from wkvlab.errors import ConfigError
from wkvlab.models.loading import _folder_fingerprint, load_model
from wkvlab.weights import CalibrationSet, CalibrationSpec, WeightSpec, quantize_model_weights
from wkvlab.weights.arch import decoder_layers
from wkvlab.weights.cache import cache_key

WKVLAB = [sys.executable, "-m", "wkvlab.cli"]


def _cli(*args):
    return subprocess.run([*WKVLAB, *args], capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("any-model")
    made = {f.__name__: save_folder(f(), root / f.__name__) for f in (tiny_mixtral, tiny_qwen3_moe, tiny_gemma3_multimodal)}
    made["text"] = word_text(root / "text.txt")
    return made


@pytest.mark.parametrize("name", ["tiny_mixtral", "tiny_qwen3_moe", "tiny_gemma3_multimodal"])
def test_eval_quantizes_every_decoder_linear_and_expert(folders, name, tmp_path):
    out = tmp_path / "r.json"
    run = _cli("eval", "--model", str(folders[name]), "--data", str(folders["text"]), "--ctx", "64", "--tokens", "128",
               "--weights", "int4-g128", "--device", "cpu", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["quantized_fraction"] == 1.0
    assert result["kld"]["mean"] > 0


def test_eval_refuses_awq_on_experts_in_one_line_before_loading(folders):
    run = _cli("eval", "--model", str(folders["tiny_mixtral"]), "--data", str(folders["text"]), "--ctx", "64", "--tokens", "128",
               "--weights", "int4-g128,awq-int4-g128", "--device", "cpu")
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: awq-int4-g128: awq on the fused MoE experts of tiny_mixtral (mixtral) is not implemented")
    assert not any(line.startswith(("wkvlab eval:", "loading")) for line in lines)  # refused before the run started


def test_multimodal_quantizes_the_language_model_not_the_vision_tower():
    model = tiny_gemma3_multimodal()
    assert [n for n, _ in decoder_layers(model)] == ["model.language_model.layers.0", "model.language_model.layers.1"]
    built = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    assert built.quantized_fraction == 1.0
    for name, before in model.state_dict().items():
        after = built.model.state_dict()[name]
        if name.startswith("model.vision_tower") or name.startswith("model.multi_modal_projector"):
            assert torch.equal(before, after), name
        elif name.startswith("model.language_model.layers.") and name.endswith("proj.weight"):
            assert not torch.equal(before, after), name


@pytest.mark.parametrize("make", [tiny_qwen25_vl, tiny_mistral3])
def test_other_multimodal_layouts_find_their_language_layers(make):
    model = make()
    assert [n for n, _ in decoder_layers(model)] == ["model.language_model.layers.0", "model.language_model.layers.1"]
    assert quantize_model_weights(model, WeightSpec.parse("int4-g32")).quantized_fraction == 1.0


def test_llama4_experts_of_an_undeclared_layout_are_refused_not_skipped():
    model = tiny_llama4()
    assert [n for n, _ in decoder_layers(model)] == ["language_model.model.layers.0", "language_model.model.layers.1"]
    with pytest.raises(ConfigError, match=r"feed_forward\.experts\.gate_up_proj: a fused 3-D weight in Llama4TextExperts"):
        quantize_model_weights(model, WeightSpec.parse("int4-g128"))
    from wkvlab.weights.support import check_config

    with pytest.raises(ConfigError, match=r"int4-g128: tiny \(llama4_text\): fused experts in Llama4TextExperts, a layout"):
        check_config([WeightSpec.parse("int4-g128")], model.config.to_dict(), "tiny")  # before loading, from config.json


def test_multimodal_loads_and_reads_its_text_config(folders):
    loaded = load_model(str(folders["tiny_gemma3_multimodal"]))
    assert type(loaded.model).__name__ == "Gemma3ForConditionalGeneration"
    assert loaded.max_context == 256
    from wkvlab.eval.runner import ModelShape, check_kv_specs
    from wkvlab.kv.spec import KVSpec

    assert ModelShape.of(loaded.model).layers == 2
    check_kv_specs(loaded.model, [KVSpec.parse("q8_0")])


def _calibration():
    g = torch.Generator().manual_seed(1)
    return CalibrationSet(CalibrationSpec("prose", 4, 32), torch.randint(0, 256, (4, 32), generator=g), "test")


def test_a_fine_tune_with_the_same_sizes_gets_its_own_fingerprint_and_cache_entries(tmp_path):
    from safetensors.torch import load_file, save_file

    base = save_folder(tiny_llama(vocab_size=256), tmp_path / "base")
    tuned = tmp_path / "tuned"
    shutil.copytree(base, tuned)
    tensors = load_file(str(tuned / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name] + 1e-3  # a fine-tune: same names, shapes, sizes and config
    save_file(tensors, str(tuned / "model.safetensors"), metadata={"format": "pt"})
    assert (base / "model.safetensors").stat().st_size == (tuned / "model.safetensors").stat().st_size
    assert (base / "config.json").read_bytes() == (tuned / "config.json").read_bytes()
    a, b = _folder_fingerprint(base), _folder_fingerprint(tuned)
    assert a != b
    same = tmp_path / "copy"
    shutil.copytree(base, same)
    assert _folder_fingerprint(same) == a  # content, not path or time
    spec = WeightSpec.parse("gptq-int4-g32")
    assert cache_key(a, spec, _calibration()) != cache_key(b, spec, _calibration())
    # a rewrite of the same size in place is seen too (the memo is keyed by the file's stat)
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, str(tuned / "model.safetensors"), metadata={"format": "pt"})
    assert _folder_fingerprint(tuned) not in (a, b)


def _offloaded(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save_folder(tiny_llama(vocab_size=256), tmp_path / "m")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    return AutoModelForCausalLM.from_pretrained(str(folder), device_map=device_map, offload_folder=str(tmp_path / "offload")).eval()


def test_offloaded_layers_are_refused_before_any_work(tmp_path):
    from wkvlab.data.windows import make_windows
    from wkvlab.eval.runner import run_grid
    from wkvlab.kv.spec import KVSpec

    model = _offloaded(tmp_path)
    assert any(p.is_meta for p in model.parameters())  # accelerate keeps layer 1's weights on disk
    windows = make_windows(torch.randint(0, 256, (256,)), ctx=64, n_tokens=128, bos_id=None)
    steps = []
    with pytest.raises(ConfigError, match=r"1 module\(s\) of the model \(e\.g\. model\.layers\.1\) were offloaded") as info:
        run_grid(model, windows, [WeightSpec.parse("int4-g128")], [KVSpec.parse("fp16")], model_name="m", data_name="d",
                 progress=lambda d, n: steps.append(d))
    assert "\n" not in str(info.value) and steps == []  # not even the reference pass ran
    with pytest.raises(ConfigError, match="offloaded by accelerate"):
        quantize_model_weights(model, WeightSpec.parse("int8"))


def test_cache_dir_is_stated_with_its_size_and_the_weight_cache_can_be_skipped(folders, tmp_path):
    def header(*extra):
        run = _cli("eval", "--model", str(folders["tiny_qwen3_moe"]), "--data", str(folders["text"]), "--ctx", "64", "--tokens", "64",
                   "--weights", "gptq-int4-g32", "--calib-samples", "2", "--calib-len", "32", "--device", "cpu", *extra)
        assert run.returncode == 0, run.stderr[-2000:]
        return next(line for line in run.stderr.splitlines() if line.startswith("wkvlab eval:"))

    cache = tmp_path / "cache"
    assert f"cache {cache}: empty; " in header("--cache-dir", str(cache))
    assert (cache / "quantized").is_dir()
    assert f"cache {cache}: calibrated weight builds " in header("--cache-dir", str(cache))  # the build is there now, with its size
    other = tmp_path / "other"
    assert "quantized weights not cached (--no-weight-cache)" in header("--cache-dir", str(other), "--no-weight-cache")
    assert not (other / "quantized").exists()


def test_multimodal_in_place_build_snapshots_only_the_language_layers_and_restores_exactly():
    from wkvlab.weights.restore import WeightSnapshot

    model = tiny_gemma3_multimodal()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spec = WeightSpec.parse("int4-g32")
    snapshot = WeightSnapshot(model, [spec])
    assert snapshot.names and all(n.startswith("model.language_model.layers.") for n in snapshot.names)
    built = quantize_model_weights(model, spec, in_place=True, originals=snapshot)
    assert built.model is model and not built.lossless
    snapshot.restore(model, built.hooks)
    snapshot.close()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
