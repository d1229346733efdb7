"""Weight bytes: the seeds' numbers and each format's formula."""
from __future__ import annotations

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import FORMATS, ModelDescription, parse_weight_spec, weight_bytes
from wkvlab.plan.weights import matrix_bytes, weight_format

GB, GIB = 1e9, 2**30


@pytest.fixture(scope="module")
def llama70():
    return ModelDescription.from_name("Llama-3-70B")


@pytest.fixture(scope="module")
def llama8():
    return ModelDescription.from_name("Llama-3-8B")


def test_llama3_70b_bf16_about_140_gb(llama70):
    assert weight_bytes(llama70, "bf16").total_bytes / GB == pytest.approx(141.1, abs=0.05)


def test_llama3_70b_w4a16_37_to_40_gb(llama70):
    for fmt in ("int4-g128", "awq-int4-g128", "gptq-int4-g128"):
        assert 37 <= weight_bytes(llama70, fmt).total_bytes / GB <= 40


def test_llama3_8b_seed_sizes(llama8):
    assert weight_bytes(llama8, "bf16").total_bytes / GB == pytest.approx(16.06, abs=0.01)
    assert 5.5 <= weight_bytes(llama8, "int4-g128").total_bytes / GB <= 6.0
    w8a8 = weight_bytes(llama8, "w8a8-int8").total_bytes
    # 8-9 holds in GiB (8.46); in GB it is 9.08 because embeddings and lm_head (1.05 B params)
    # stay 16-bit — the seed's "about 8 GB" is half of BF16 and forgets them.
    assert 8 <= w8a8 / GIB <= 9
    assert w8a8 / GB == pytest.approx(9.08, abs=0.01)


def test_breakdown_sums_and_leftovers_are_16_bit(llama70):
    w = weight_bytes(llama70, "int4-g128")
    assert sum(p.bytes for p in w.breakdown) == w.total_bytes == w.value_bytes + w.scale_bytes + w.leftover_bytes
    parts = {p.name: p for p in w.breakdown}
    assert parts["embedding"].bytes == parts["lm_head"].bytes == 128256 * 8192 * 2
    assert parts["linear layers"].bytes == parts["linear layers"].params // 2


def test_tied_embeddings_counted_once():
    m = ModelDescription.from_name("SmolLM2-135M")
    parts = {p.name for p in weight_bytes(m, "bf16").breakdown}
    assert "lm_head" not in parts
    assert weight_bytes(m, "bf16").total_bytes == 2 * 134_515_008


@pytest.mark.parametrize("fmt,values,meta", [
    # 4096 x 4096 matrix; metadata per the format definitions.
    ("bf16", 4096 * 4096 * 2, 0),
    ("int8", 4096 * 4096, 4096 * 2),  # fp16 scale per output channel
    ("int4-g128", 4096 * 4096 // 2, 32 * 4096 * 20 // 8),  # fp16 scale + 4-bit zero per group
    ("gptq-int4-g128", 4096 * 4096 // 2, 32 * 4096 * 20 // 8 + 4096 * 4),  # + int32 g_idx
    ("fp8", 4096 * 4096, 4096 * 4),  # fp32 scale per output row (compressed-tensors)
    ("llm-int8", 4096 * 4096, 4096 * 4),  # fp32 absmax per row
    ("nvfp4", 4096 * 4096 // 2, 4096 * 4096 // 16 + 8),  # E4M3 per 16 + two fp32 tensor scales
    ("mxfp4", 4096 * 4096 // 2, 4096 * 4096 // 32),  # E8M0 per 32
    ("q8_0", 4096 * 4096, 4096 * 4096 // 32 * 2),  # 34 B per 32
    ("q4_0", 4096 * 4096 // 2, 4096 * 4096 // 32 * 2),  # 18 B per 32
])
def test_matrix_byte_formulas(fmt, values, meta):
    assert matrix_bytes(FORMATS[fmt], 4096, 4096) == (values, meta)


def test_gguf_block_sizes():
    v, m = matrix_bytes(FORMATS["q8_0"], 32, 1)
    assert v + m == 34
    v, m = matrix_bytes(FORMATS["q4_0"], 32, 1)
    assert v + m == 18


def test_gguf_output_tensor_is_q6k_or_q8_0_fallback(llama8):
    parts = {p.name: p for p in weight_bytes(llama8, "q4_0").breakdown}
    assert parts["lm_head"].stored_as == "q6_K" and parts["lm_head"].bytes == 128256 * 4096 // 256 * 210
    assert parts["embedding"].stored_as == "q4_0"
    assert parts["norm"].stored_as == "f32"
    smol = ModelDescription.from_name("SmolLM2-135M")  # 576 is not a multiple of 256
    parts = {p.name: p for p in weight_bytes(smol, "q4_0").breakdown}
    assert parts["embedding"].stored_as == "q8_0"


def test_skip_layers_stay_16_bit(llama70):
    plain = weight_bytes(llama70, "int4-g128")
    skipped = weight_bytes(llama70, "int4-g128;skip=0,79")
    per_layer = 855_638_016  # linear params of one Llama-3-70B layer
    assert skipped.total_bytes > plain.total_bytes
    assert any(p.name.startswith("skipped layers") and p.bytes == 2 * 2 * per_layer for p in skipped.breakdown)
    assert str(parse_weight_spec("int4-g128;skip=79,0")) == "int4-g128;skip=0,79"


@pytest.mark.parametrize("spec", ["int9", "", "int4-g128;skip=x", "int4-g128;foo=1", "bf16;skip=5-2",
                                  "int4-g0", "int4-sym-asym"])
def test_bad_weight_specs(spec):
    with pytest.raises(ConfigError):
        parse_weight_spec(spec)


def test_skip_layer_out_of_range(llama8):
    with pytest.raises(ConfigError, match="do not exist"):
        weight_bytes(llama8, "int4-g128;skip=32")


@pytest.mark.parametrize("name", ["bf16", "fp16", "int8", "int4-g128", "fp8", "fp8-wo", "int4",
                                  "int3-g64-fmin", "int2-g32", "int8-g128-asym", "int4-g128-sym"])
@pytest.mark.parametrize("shape", [(4096, 4096), (1536, 576), (128256, 8192)])
def test_bytes_agree_with_wkvlab_weights(name, shape):
    """Contract: matrix bytes equal wkvlab.weights.rtn.weight_storage_bytes for shared names."""
    rtn = pytest.importorskip("wkvlab.weights.rtn")
    spec = pytest.importorskip("wkvlab.weights.spec").WeightSpec.parse(name)
    out, inp = shape
    assert sum(matrix_bytes(weight_format(name), inp, out)) == rtn.weight_storage_bytes(shape, spec)


def test_general_int_names():
    assert weight_format("int3-g64").group_meta_bits == 16 + 3
    assert weight_format("int4-g32-fmin").group_meta_bits == 32
    assert weight_format("int8").weight_only
    with pytest.raises(ConfigError):
        weight_format("int4-sym-fmin")
