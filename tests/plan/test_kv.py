"""KV bytes: the seeds' GiB numbers, block formats, layouts, windows, MLA."""
from __future__ import annotations

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import KV_FORMATS, ModelDescription, kv_bytes_per_token, kv_cache_bytes, parse_kv
from wkvlab.plan.kv import kv_format, row_bytes, sequence_bytes

GIB = 2**30


@pytest.fixture(scope="module")
def llama70():
    return ModelDescription.from_name("Llama-3-70B")


@pytest.mark.parametrize("kv,data_gib,scale_gib", [
    ("bf16", 40, 0), ("fp16", 40, 0), ("fp8_e4m3", 20, 0), ("fp8_e5m2", 20, 0),
    ("int8", 20, 0.3125), ("int4", 10, 0.625), ("q8_0", 20, 1.25), ("q4_0", 10, 1.25),
])
def test_llama3_70b_batch16_ctx8192(llama70, kv, data_gib, scale_gib):
    """Seed: 2 x 80 x 8 x 128 x 16 x 8192 x 2 B = 40 GiB in BF16; FP8 20; INT4 10 + scales.

    Scales are reported apart: int8 keeps an fp16 scale per token and head (0.3125 GiB), int4 an
    fp16 scale and an fp16 minimum (0.625 GiB), llama.cpp blocks an fp16 d per 32 values.
    """
    size = kv_cache_bytes(kv_bytes_per_token(llama70, kv), batch=16, ctx=8192)
    assert size.data_bytes == data_gib * GIB
    assert size.scale_bytes == scale_gib * GIB


def test_bytes_per_token_formula(llama70):
    kv = kv_bytes_per_token(llama70, "bf16")
    assert kv.total_bytes == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv.layers_with_kv == 80


@pytest.mark.parametrize("fmt,total", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22),
                                       ("q5_1", 24), ("iq4_nl", 18)])
def test_llamacpp_blocks_of_32(fmt, total):
    data, scale = row_bytes(KV_FORMATS[fmt], 32)
    assert data + scale == total


@pytest.mark.parametrize("fmt,per_row", [("int8", 128 + 2), ("int4", 64 + 4), ("int2", 32 + 4),
                                         ("fp8_e4m3", 128), ("bf16", 256)])
def test_per_token_head_rows(fmt, per_row):
    assert sum(row_bytes(KV_FORMATS[fmt], 128)) == per_row


def test_q8_0_costs_34_per_32(llama70):
    kv = kv_bytes_per_token(llama70, "q8_0")
    assert kv.total_bytes * 32 == 2 * 80 * 8 * 128 * 34


def test_engine_row_scale_override(llama70):
    """vLLM's per-token-head caches keep fp32 scales: head_size + 4 bytes per row."""
    assert kv_bytes_per_token(llama70, "int8", row_scale_bytes=4).scale_bytes == 2 * 80 * 8 * 4
    assert kv_bytes_per_token(llama70, "fp8_e4m3", row_scale_bytes=4).scale_bytes == 0


@pytest.mark.parametrize("spec,canonical", [
    ("auto", "bf16"), ("f16", "fp16"), ("fp8", "fp8_e4m3"), ("K8V4", "int8/int4"),
    ("kv8", "int8"), ("KV16", "bf16"), ("k=q8_0,v=q4_0", "q8_0/q4_0"), ("q8_0/q4_0", "q8_0/q4_0"),
    ("k=q8_0,v=q8_0", "q8_0"), ("int4-g32", "int4-g32-asym"), ("int8-g64", "int8-g64-sym"),
    ("0-3=q8_0/q4_0;1", None),
    ("int4;0-3,76-79=int8;skip=0", "int4;0-3,76-79=int8;skip=0"),
    ("int4;skip=1,0,sliding_window", "int4;skip=0-1,sliding_window"),
])
def test_spec_strings_round_trip(spec, canonical):
    if canonical is None:
        with pytest.raises(ConfigError):
            parse_kv(spec)
        return
    assert str(parse_kv(spec)) == canonical
    assert str(parse_kv(canonical)) == canonical


def test_per_layer_map_and_skip(llama70):
    kv = kv_bytes_per_token(llama70, "int4;0-3,76-79=int8;skip=0")
    by_layer = {x.layer: x for x in kv.per_layer}
    assert by_layer[0].k == "bf16" and by_layer[1].k == "int8" and by_layer[40].k == "int4"
    assert kv.data_bytes == 8 * 128 * (2 * 2 + 7 * 2 * 1 + 72 * 2 * 0.5)


def test_mixed_pair_bytes(llama70):
    kv = kv_bytes_per_token(llama70, "q8_0/q4_0")
    assert kv.total_bytes == 80 * 8 * (4 * 34 + 4 * 18)
    assert kv_bytes_per_token(llama70, "int4;0-3=q8_0/q4_0").per_layer[2].v == "q4_0"


@pytest.mark.parametrize("spec", ["", "int9", "k=q8_0", "k=q8_0,x=q4_0", "K3V4", "int4;0-3",
                                  "int4;a-b=int8", "q8_0,q4_0", "q8_0/", "a/b/c", "int4-g0"])
def test_bad_kv_specs(spec):
    with pytest.raises(ConfigError):
        parse_kv(spec)


def test_layer_out_of_range(llama70):
    with pytest.raises(ConfigError, match="has layers"):
        kv_bytes_per_token(llama70, "int4;skip=80")


def test_block_format_needs_divisible_head_dim():
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 80, "num_attention_heads": 2,
           "vocab_size": 10}  # head_dim 40
    with pytest.raises(ConfigError, match="divisible by 32"):
        kv_bytes_per_token(ModelDescription.from_config(cfg), "q8_0")


def test_sliding_window_layers_cap_at_window():
    m = ModelDescription.from_name("Gemma-3-27B")
    kv = kv_bytes_per_token(m, "bf16")
    row = 2 * 16 * 128 * 2  # K+V, 16 KV heads x 128, bf16
    assert sequence_bytes(kv, 32768) == 10 * 32768 * row + 52 * 1024 * row
    assert sequence_bytes(kv, 512) == 62 * 512 * row
    # Skipping the sliding layers keeps them at 16 bit: no change for a bf16 cache.
    assert kv_bytes_per_token(m, "fp8_e4m3;skip=sliding_window").per_layer[0].k == "bf16"


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


@pytest.mark.parametrize("name", ["fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2", "q8_0", "q4_0",
                                  "int4-g32", "int2-g64-sym", "int8-g32-asym"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_bytes_agree_with_wkvlab_kv_formats(name, head_dim):
    """Contract: the planner counts exactly what wkvlab's KV simulation (wkvlab.kv) stores."""
    kv_formats = pytest.importorskip("wkvlab.kv.formats")
    theirs = kv_formats.get_kv_format(name)
    mine = kv_format(parse_kv(name).default.k)
    assert mine.name == theirs.name
    assert sum(row_bytes(mine, head_dim)) == theirs.bytes_per_vector(head_dim)
