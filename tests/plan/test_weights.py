"""Weight bytes of a WeightSpec on a described model: the seeds' numbers, each format, GGUF layout, shards."""
from __future__ import annotations

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import ModelDescription, Shard, weight_bytes
from wkvlab.plan.weights import as_weight_spec, execution
from wkvlab.weights import WeightSpec, weight_storage_bytes

GB, GIB = 1e9, 2**30


@pytest.fixture(scope="module")
def llama70():
    return ModelDescription.from_name("Llama-3-70B")


@pytest.fixture(scope="module")
def llama8():
    return ModelDescription.from_name("Llama-3-8B")


def test_llama3_70b_bf16_and_w4(llama70):
    assert weight_bytes(llama70, "bf16").total_bytes / GB == pytest.approx(141.1, abs=0.05)
    assert weight_bytes(llama70, "int4-g128").total_bytes == 39_767_785_472  # 37.04 GiB, AWQ checkpoints ~39.8 GB
    for fmt in ("awq-int4-g128", "gptq-int4-g128"):
        assert 37 <= weight_bytes(llama70, fmt).total_bytes / GB <= 40


def test_llama3_8b_seed_sizes(llama8):
    assert weight_bytes(llama8, "bf16").total_bytes / GB == pytest.approx(16.06, abs=0.01)
    assert weight_bytes(llama8, "int4-g128").total_bytes == 5_727_854_592
    w8a8 = weight_bytes(llama8, "w8a8-int8").total_bytes
    assert w8a8 / GB == pytest.approx(9.08, abs=0.01)  # embeddings + lm_head (1.05 B params) stay 16-bit


def test_linear_bytes_are_wkvlabs_own_storage_count(llama8):
    """One byte definition: a 4096 x 4096 matrix costs what wkvlab.weights.storage counts for the measured model."""
    for name in ("int8", "int4-g128", "gptq-int4-g128", "fp8", "nvfp4", "mxfp4", "q8_0", "q4_0", "int3-g64-fmin"):
        spec = WeightSpec.parse(name)
        one = weight_bytes(llama8, spec).quantized_bytes
        per_layer = sum(weight_storage_bytes(shape, spec) * n for shape, n in [((4096, 4096), 2), ((1024, 4096), 2),
                                                                                 ((14336, 4096), 2), ((4096, 14336), 1)])
        assert one == pytest.approx(32 * per_layer, abs=32 * 7), name


def test_breakdown_sums_and_leftovers_are_16_bit(llama70):
    w = weight_bytes(llama70, "int4-g128")
    assert sum(p.bytes for p in w.breakdown) == w.total_bytes == w.quantized_bytes + w.leftover_bytes
    parts = {p.name: p for p in w.breakdown}
    assert parts["embedding"].bytes == parts["lm_head"].bytes == 128256 * 8192 * 2


def test_tied_embeddings_counted_once():
    m = ModelDescription.from_name("SmolLM2-135M")
    assert "lm_head" not in {p.name for p in weight_bytes(m, "bf16").breakdown}
    assert weight_bytes(m, "bf16").total_bytes == 2 * 134_515_008
    assert weight_bytes(m, "none").total_bytes == weight_bytes(m, "bf16").total_bytes  # served in the checkpoint's 16 bits


def test_gguf_layout(llama8):
    """llama.cpp's layout: embedding in the file's type, output Q6_K (Q8_0 when rows are not multiples of 256), f32 norms."""
    parts = {p.name: p for p in weight_bytes(llama8, "q4_0").breakdown}
    assert parts["lm_head"].stored_as == "q6_K" and parts["lm_head"].bytes == 128256 * 4096 // 256 * 210
    assert parts["embedding"].stored_as == "q4_0" and parts["embedding"].bytes == 128256 * 4096 // 32 * 18
    assert parts["norm"].stored_as == "f32"
    smol = ModelDescription.from_name("SmolLM2-135M")  # 576 is not a multiple of 256
    assert {p.name: p for p in weight_bytes(smol, "q4_0").breakdown}["embedding"].stored_as == "q8_0"
    assert weight_bytes(llama8, "q4_0").total_bytes / GB == pytest.approx(4.65, abs=0.01)  # published file 4.66 GB
    assert weight_bytes(llama8, "q8_0").total_bytes / GB == pytest.approx(8.53, abs=0.01)


def test_skip_layers_and_overrides(llama70):
    plain = weight_bytes(llama70, "int4-g128")
    skipped = weight_bytes(llama70, "int4-g128+skip=0,79")
    per_layer = 855_638_016  # linear params of one Llama-3-70B layer
    part = {p.name: p for p in skipped.breakdown}["16-bit linear layers (skip=, overrides)"]
    assert part.params == 2 * per_layer and part.bytes == 2 * 2 * per_layer
    assert skipped.total_bytes > plain.total_bytes
    assert weight_bytes(llama70, "int4-g128;skip=79,0").total_bytes == skipped.total_bytes  # ";" is the alias of "+"
    mlp = weight_bytes(llama70, "nvfp4-mlp")  # attention in FP8 (override), MLP in NVFP4
    assert mlp.breakdown[0].stored_as == "fp8+nvfp4-mlp"


def test_bad_specs_and_layers(llama8):
    for bad in ("int9", "int4-g128+foo=1", "bf16+skip=5-2", "int4-g0"):
        with pytest.raises(ConfigError):
            weight_bytes(llama8, bad)
    with pytest.raises(ConfigError, match="do not exist"):
        weight_bytes(llama8, "int4-g128+skip=32")


def test_tensor_parallel_shards(llama70):
    """tp 4: every matrix split, the 64-padded vocabulary split, norms replicated on every rank."""
    whole, shard = weight_bytes(llama70, "bf16"), weight_bytes(llama70, "bf16", Shard(tp=4))
    norms = {p.name: p for p in whole.breakdown}["norm"].bytes
    assert shard.total_bytes == (whole.total_bytes - norms) // 4 + norms
    w4 = weight_bytes(llama70, "int4-g128", Shard(tp=4))
    # o_proj and down_proj are split along their input: each rank keeps whole groups of 128
    assert w4.quantized_bytes == weight_bytes(llama70, "int4-g128").quantized_bytes // 4


def test_execution_classes():
    assert execution(as_weight_spec("int4-g128")).weight_only
    assert execution(as_weight_spec("w8a8-int8")).compute == "int8"
    assert execution(as_weight_spec("fp8")).compute == "fp8" and execution(as_weight_spec("fp8-wo")).compute == "bf16"
    assert execution(as_weight_spec("nvfp4")).compute == "fp4"
    assert execution(as_weight_spec("llm-int8")).dequant_overhead == 0.5
