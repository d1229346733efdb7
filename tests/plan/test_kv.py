"""KV bytes of a KVSpec on a described model: the seeds' GiB numbers, block formats, layouts, windows, MLA, TP heads."""
from __future__ import annotations

import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan import ModelDescription, kv_bytes_per_token, kv_cache_bytes, sequence_bytes

GIB = 2**30


@pytest.fixture(scope="module")
def llama70():
    return ModelDescription.from_name("Llama-3-70B")


@pytest.mark.parametrize("kv,gib", [
    ("bf16", 40), ("fp16", 40), ("auto", 40), ("fp8_e4m3", 20), ("fp8_e5m2", 20),
    ("int8", 20 + 0.3125), ("int4", 10 + 0.625), ("q8_0", 20 + 1.25), ("q4_0", 10 + 1.25),
    ("int8_pth", 20 + 0.625),  # vLLM's per-token-head dtypes keep an fp32 scale: head_size + 4 B per row
])
def test_llama3_70b_batch16_ctx8192(llama70, kv, gib):
    """Seed: 2 x 80 x 8 x 128 x 16 x 8192 x 2 B = 40 GiB in BF16; FP8 20; scales on top (int8: fp16 scale per
    token and head = 0.3125 GiB; int4: scale + minimum; llama.cpp blocks: an fp16 d per 32 values)."""
    size = kv_cache_bytes(kv_bytes_per_token(llama70, kv), batch=16, ctx=8192)
    assert size.total_bytes == gib * GIB


def test_bytes_are_the_specs_own(llama70):
    """One definition: the planner's bytes per token are KVSpec.bytes_per_token on the same shape."""
    for text in ("int4", "q8_0/q4_0", "int4+skip=0,79", "int4+0-3,76-79=int8", "K8V4", "llamacpp:q4_0", "exl3:k4v4"):
        spec = KVSpec.parse(text)
        assert kv_bytes_per_token(llama70, spec).total_bytes == spec.bytes_per_token(layers=80, kv_heads=8, head_dim=128), text
    assert kv_bytes_per_token(llama70, "bf16").total_bytes == 2 * 80 * 8 * 128 * 2 == 327_680


def test_per_layer_map_and_skip(llama70):
    kv = kv_bytes_per_token(llama70, "int4+0-3,76-79=int8+skip=0")
    by_layer = {x.layer: x for x in kv.per_layer}
    assert (by_layer[0].k, by_layer[1].k, by_layer[40].k) == ("fp16", "int8", "int4")
    assert kv.total_bytes == 8 * (2 * 256 + 7 * 2 * 130 + 72 * 2 * 68)
    assert kv_bytes_per_token(llama70, "int4+0-3=q8_0/q4_0").per_layer[2].v == "q4_0"


@pytest.mark.parametrize("spec", ["", "int9", "K3V4", "int4+0-3", "int4+a-b=int8", "q8_0/", "a/b/c", "int4-g0", "int4+3-1=int8"])
def test_bad_kv_specs(llama70, spec):
    with pytest.raises(ConfigError):
        kv_bytes_per_token(llama70, spec)


def test_layer_out_of_range_and_head_dim(llama70):
    with pytest.raises(ConfigError, match="does not exist"):
        kv_bytes_per_token(llama70, "int4+skip=80")
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 80, "num_attention_heads": 2, "vocab_size": 10}  # head_dim 40
    with pytest.raises(ConfigError, match="head_dim 40"):
        kv_bytes_per_token(ModelDescription.from_config(cfg), "q8_0")


def test_sliding_window_layers_cap_at_window():
    m = ModelDescription.from_name("Gemma-3-27B")
    kv = kv_bytes_per_token(m, "bf16")
    row = 2 * 16 * 128 * 2  # K+V, 16 KV heads x 128, bf16
    assert sequence_bytes(kv, 32768) == 10 * 32768 * row + 52 * 1024 * row
    assert sequence_bytes(kv, 512) == 62 * 512 * row
    assert kv_bytes_per_token(m, "fp8_e4m3+skip=sliding_window").per_layer[0].k == "fp16"


def test_block_rounding():
    m = ModelDescription.from_name("Llama-3-8B")
    kv = kv_bytes_per_token(m, "bf16")
    size = kv_cache_bytes(kv, 2, 8193, block_size=16)
    assert size.tokens_per_sequence == 8208 and size.total_bytes == 2 * 8208 * kv.total_bytes


def test_mla_caches_one_latent():
    m = ModelDescription.from_name("DeepSeek-V3")
    assert kv_bytes_per_token(m, "bf16").total_bytes == 61 * 576 * 2
    assert kv_bytes_per_token(m, "fp8_e4m3").total_bytes == 61 * 576
    with pytest.raises(ConfigError, match="MLA"):
        kv_bytes_per_token(m, "q8_0/q4_0")


def test_linear_attention_layers_add_fixed_state():
    m = ModelDescription.from_name("Qwen3-Next-80B-A3B")
    kv = kv_bytes_per_token(m, "bf16")
    assert kv.layers_with_kv == 12 and kv.total_bytes == 12 * 2 * 2 * 256 * 2
    state = 36 * (32 * 128 * 128 + (2 * 2048 + 4096) * 3) * 2
    assert kv.state_bytes_per_sequence == state
    assert kv_cache_bytes(kv, 4, 1000).state_bytes == 4 * state


def test_tensor_parallel_heads_and_pipeline_layers(llama70):
    """tp 4: 2 of the 8 KV heads per GPU; tp 16: one replicated head per GPU; a pipeline stage holds its layers."""
    assert kv_bytes_per_token(llama70, "bf16", kv_heads=2).total_bytes == 327_680 // 4
    assert kv_bytes_per_token(llama70, "bf16", kv_heads=1).total_bytes == 327_680 // 8
    assert kv_bytes_per_token(llama70, "bf16", layers=tuple(range(40))).total_bytes == 327_680 // 2
