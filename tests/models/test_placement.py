"""--device cuda placement without a GPU: the plan on a meta model, and what load_model hands transformers
(one GPU when it holds the weights, split over GPUs otherwise, never offloaded)."""
import pytest
import torch

from tests.conftest import tiny_llama
from tests.fake_device import on_meta
from tests.models.tiny_folders import save_folder
from wkvlab.errors import ConfigError, ModelError
from wkvlab.models import loading
from wkvlab.models.placement import describe_device_map, plan_device_map, weight_bytes


@pytest.fixture(scope="module")
def meta_model():
    return on_meta(tiny_llama(vocab_size=256))


def test_weight_bytes_counts_every_parameter_and_buffer(meta_model):
    assert sum(p.numel() for p in meta_model.parameters()) == 131_392
    assert weight_bytes(meta_model) == 4 * (131_392 + 2 * 16)  # float32, and rotary's inv_freq (and its original) of head_dim / 2


def test_one_gpu_when_it_holds_the_weights(meta_model):
    size = weight_bytes(meta_model)
    assert plan_device_map(meta_model, {0: size, 1: 10 * size}) == {"": 0}  # the first that holds it, not balanced
    assert plan_device_map(meta_model, {0: size - 1, 1: size}) == {"": 1}


def test_split_over_gpus_only_when_none_holds_it(meta_model):
    size = weight_bytes(meta_model)
    mapping = plan_device_map(meta_model, {0: int(size * 0.6), 1: int(size * 0.6)})
    assert set(mapping.values()) == {0, 1}
    assert "cuda:0 (" in describe_device_map(mapping) and "cuda:1 (" in describe_device_map(mapping)


def test_balanced_and_sequential_choose_the_split(meta_model):
    size = weight_bytes(meta_model)
    balanced = plan_device_map(meta_model, {0: 10 * size, 1: 10 * size}, "balanced")
    assert set(balanced.values()) == {0, 1}  # split although one GPU holds it
    assert set(plan_device_map(meta_model, {0: 10 * size, 1: 10 * size}, "sequential").values()) == {0}


def test_offloading_is_refused_with_what_is_missing(meta_model):
    size = weight_bytes(meta_model)
    with pytest.raises(ModelError) as info:
        plan_device_map(meta_model, {0: size // 4, 1: size // 4}, name="m")
    message = str(info.value)
    assert "\n" not in message and message.startswith("m needs 0.0 GiB of weights and the GPUs can take 0.0 GiB (cuda:0 0.0, cuda:1 0.0")
    assert "does not offload layers to the CPU or disk" in message
    with pytest.raises(ConfigError, match="unknown --device-map 'disk'"):
        plan_device_map(meta_model, {0: size}, "disk")


def _fake_gpus(monkeypatch, free: list[int]):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(free))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (free[int(i)], 80 << 30))


@pytest.fixture
def folder(tmp_path):
    return save_folder(tiny_llama(vocab_size=256), tmp_path / "m")


def _captured_load(monkeypatch, folder, free, **kwargs):
    """load_model(folder, device="cuda") with fake GPUs: the kwargs transformers got, the model kept on the CPU."""
    from transformers import AutoModelForCausalLM

    _fake_gpus(monkeypatch, free)
    seen = {}
    real = AutoModelForCausalLM.from_pretrained.__func__

    def capture(cls, path, **kw):
        if "device_map" in kw:
            seen["device_map"] = kw.pop("device_map")
        return real(cls, path, **kw)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(capture))
    loading.load_model(str(folder), device="cuda", dtype="float32", **kwargs)
    return seen


def test_load_model_puts_a_model_that_fits_on_one_gpu(monkeypatch, folder):
    size = weight_bytes(on_meta(tiny_llama(vocab_size=256)))
    assert _captured_load(monkeypatch, folder, [10 * size, 10 * size])["device_map"] == {"": 0}  # not "auto": never balanced by default
    assert _captured_load(monkeypatch, folder, [size // 2, 10 * size])["device_map"] == {"": 1}
    split = _captured_load(monkeypatch, folder, [10 * size, 10 * size], device_map="balanced")["device_map"]
    assert set(split.values()) == {0, 1}


def test_load_model_refuses_before_reading_a_weight(monkeypatch, folder):
    with pytest.raises(ModelError, match="does not offload"):
        _captured_load(monkeypatch, folder, [1000, 1000])


def test_a_gguf_goes_to_the_gpus_from_its_converted_folder(monkeypatch, tmp_path):
    """The GGUF is converted on the host tensor by tensor, then loaded like any folder: straight to
    the device by the folder's plan, never as a whole float32 model on the CPU first."""
    from wkvlab.models.packaged import packaged_gguf

    seen = []
    monkeypatch.setattr(loading, "_convert_copy", lambda path, dtype, target: tmp_path)
    monkeypatch.setattr(loading, "_from_pretrained", lambda folder, dtype, **kw: seen.append((folder, kw["device"])) or (tiny_llama(), None))
    _fake_gpus(monkeypatch, [80 << 30])
    loading.load_gguf(packaged_gguf("default"), device="cuda", use_cache=False)
    assert seen == [(tmp_path, "cuda")]


def test_a_gguf_too_big_for_the_gpus_is_refused_before_its_conversion(monkeypatch):
    from wkvlab.models.packaged import packaged_gguf

    converted = []
    monkeypatch.setattr(loading, "_convert_copy", lambda *a, **k: converted.append(a) or (_ for _ in ()).throw(AssertionError("converted")))
    _fake_gpus(monkeypatch, [1 << 20])  # 1 MiB free: SmolLM2-135M does not fit
    with pytest.raises(ModelError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf needs 0\.5 GiB of weights and the GPUs can take 0\.0 GiB \(cuda:0 0\.0; 90% of what is free\)"):
        loading.load_gguf(packaged_gguf("default"), device="cuda", use_cache=False)
    assert converted == []
