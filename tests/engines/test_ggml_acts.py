"""llama.cpp's matmul-input rounding: bit-exact q8 blocks, and which linears get it from a GGUF."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from tests.conftest import tiny_llama
from wkvlab.engines.ggml_acts import describe_plan, ggml_activation_plan, gguf_linear_types
from wkvlab.errors import ModelError
from wkvlab.formats import fake_quant_q8_K
from wkvlab.models.packaged import packaged_gguf
from wkvlab.weights.activations import ActivationQuant, attach_activation_quantizers, fake_quant_activation

Q8 = ActivationQuant(kind="ggml-q8")


def test_ggml_q8_activation_is_gguf_q8_0_bit_for_bit():
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((4, 7, 96)) * rng.uniform(0.01, 30, (4, 7, 1))).astype(np.float32)
    rows[0, 0, :32] = 0.0  # an all-zero block: scale 0
    rows[1, 1, 5] = -1e4  # an outlier sets its block's scale
    rows[2, 2, :32] = np.arange(32, dtype=np.float32) - 12.7  # many codes near .5 after scaling
    want = dequantize(quantize(rows.reshape(-1, 96), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0).reshape(rows.shape)
    got = fake_quant_activation(torch.from_numpy(rows), Q8).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def _tiny_gguf(path, types: dict[str, GGMLQuantizationType]) -> None:
    """A GGUF holding only the named 2-D tensors (64 columns; content irrelevant), stored as ``types`` say."""
    writer = GGUFWriter(str(path), "llama")
    for name, qtype in types.items():
        block, size = GGML_QUANT_SIZES[qtype]
        cols = max(64, block)
        writer.add_tensor(name, np.zeros((8, cols // block * size), dtype=np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_plan_follows_the_gguf_types_and_ties_the_head_to_the_embedding(tmp_path):
    q = GGMLQuantizationType
    path = tmp_path / "m.gguf"
    _tiny_gguf(path, {"token_embd.weight": q.Q8_0, "blk.0.attn_q.weight": q.Q4_1, "blk.0.ffn_down.weight": q.F16,
                      "blk.1.attn_output.weight": q.Q5_0, "blk.1.ffn_up.weight": q.Q4_0})
    assert gguf_linear_types(path) == {"lm_head": "Q8_0", "model.layers.0.self_attn.q_proj": "Q4_1", "model.layers.0.mlp.down_proj": "F16",
                                       "model.layers.1.self_attn.o_proj": "Q5_0", "model.layers.1.mlp.up_proj": "Q4_0"}
    model = tiny_llama()
    plan = ggml_activation_plan(model, path)
    assert set(plan) == {"lm_head", "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.up_proj",
                         "model.layers.0.mlp.down_proj"}
    assert plan.pop("model.layers.0.mlp.down_proj") == ActivationQuant(kind="ggml-f16")  # F16 weights: fp16 inputs
    assert all(p == Q8 for p in plan.values())
    # the hooks round exactly the planned linears' inputs
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, args, out, n=n: seen.__setitem__(n, args[0])) for n, m in model.named_modules()
             if n in ("lm_head", "model.layers.0.mlp.down_proj")]
    handles = attach_activation_quantizers(model, plan)
    with torch.no_grad():
        model(torch.arange(10)[None])
    for h in [*hooks, *handles]:
        h.remove()
    head_in = seen["lm_head"]
    assert torch.equal(head_in, fake_quant_activation(head_in, Q8))  # already on the q8 grid
    assert not torch.equal(seen["model.layers.0.mlp.down_proj"], fake_quant_activation(seen["model.layers.0.mlp.down_proj"], Q8))


def test_k_quant_weights_get_q8_K_inputs_and_unknown_types_are_refused(tmp_path):
    q = GGMLQuantizationType
    path = tmp_path / "k.gguf"
    _tiny_gguf(path, {"token_embd.weight": q.Q8_0, "blk.0.ffn_down.weight": q.Q4_K, "blk.1.ffn_down.weight": q.Q6_K})
    plan = ggml_activation_plan(tiny_llama(), path)
    assert plan["model.layers.0.mlp.down_proj"] == plan["model.layers.1.mlp.down_proj"] == ActivationQuant(kind="ggml-q8k")
    assert describe_plan(plan) == "ggml-q8 on 1 linear, ggml-q8k on 2 linears"
    _tiny_gguf(path, {"token_embd.weight": q.Q8_0, "blk.0.ffn_down.weight": q.I8})
    with pytest.raises(ModelError, match="I8.*not simulated"):
        ggml_activation_plan(tiny_llama(), path)


def _quantize_row_q8_K_ref(x: np.ndarray) -> np.ndarray:
    """ggml-quants.c quantize_row_q8_K_ref + dequantize_row_q8_K, line by line in float32 numpy."""
    out = np.zeros_like(x)
    for i, block in enumerate(x.reshape(-1, 256)):
        amax, peak = np.float32(0), np.float32(0)
        for v in block:
            if abs(v) > amax:
                amax, peak = np.float32(abs(v)), v
        if amax == 0:
            continue
        iscale = np.float32(-127.0) / peak
        # nearest_int: fval + 12582912.f, then the low mantissa bits (round half to even)
        magic = (iscale * block + np.float32(12582912.0)).astype(np.float32)
        codes = (magic.view(np.int32) & 0x007FFFFF) - 0x00400000
        codes = np.minimum(127, codes)
        d = np.float32(1.0) / iscale
        out.reshape(-1, 256)[i] = d * codes.astype(np.float32)
    return out


def test_q8_K_matches_ggml_reference_bit_for_bit():
    rng = np.random.default_rng(1)
    rows = (rng.standard_normal((3, 512)) * rng.uniform(0.01, 40, (3, 1))).astype(np.float32)
    rows[0, :256] = 0.0  # all-zero block: stays zero
    rows[1, 7] = 900.0  # positive outlier sets the block: iscale negative
    rows[1, 300] = -5e3  # negative outlier
    rows[2, :256] = (np.arange(256, dtype=np.float32) - 127) / 2  # codes on exact .5 ties: half to even
    rows[2, 256:] = 3.0
    rows[2, 256 + 9] = -3.0  # tie in magnitude: the first one decides the sign of the scale
    want = _quantize_row_q8_K_ref(rows)
    got = fake_quant_q8_K(torch.from_numpy(rows)).numpy()
    np.testing.assert_array_equal(got, want)
    # hand-computed: a block of 256 values 0..255 -> max 255, iscale -127/255, d = -255/127;
    # value 1 -> nearest_int(-0.498) = 0; value 3 -> nearest_int(-1.494) = -1 -> 255/127
    ramp = fake_quant_q8_K(torch.arange(256, dtype=torch.float32))
    assert ramp[1] == 0 and ramp[3] == torch.tensor(-255 / 127, dtype=torch.float32) * -1 and ramp[255] == 255
    with pytest.raises(Exception, match="multiple of 256"):
        fake_quant_q8_K(torch.ones(2, 64))


def test_packaged_default_gguf_is_q4_1_with_a_q8_0_tied_head():
    types = gguf_linear_types(packaged_gguf("default"))
    assert len(types) == 30 * 7 + 1
    assert types.pop("lm_head") == "Q8_0"
    assert set(types.values()) == {"Q4_1"}


def test_gelu_follows_ggml_fp16_table():
    from wkvlab.engines.ggml_acts import ggml_gelu_f16

    # every fp16 input in (-10, 10): ggml_table_gelu_f16[i] = fp16(ggml_gelu_f32(fp16_to_fp32(i)))
    h = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    h = h[torch.isfinite(h) & (h > -10) & (h < 10)]
    import ctypes
    import ctypes.util

    tanhf = ctypes.CDLL(ctypes.util.find_library("m")).tanhf
    tanhf.restype, tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
    a, s = np.float32(0.044715), np.float32(0.79788456080286535587989211986876)
    sample = h[:: 7].numpy().astype(np.float32)  # every 7th fp16 value, computed one by one as the C loop does
    table = np.array([np.float32(0.5) * v * (np.float32(1) + np.float32(tanhf(float(s * v * (np.float32(1) + a * v * v)))))
                      for v in sample], dtype=np.float32).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(ggml_gelu_f16(h[::7]).numpy(), table)
    # outside the table: 0 below -10, the input itself from 10 up (not rounded to fp16)
    edge = torch.tensor([-11.0, 10.0, 12.3456789])
    assert ggml_gelu_f16(edge).tolist() == [0.0, 10.0, edge[2].item()]
    # inside: the input is rounded to fp16 first
    assert ggml_gelu_f16(torch.tensor([1.00001])) == ggml_gelu_f16(torch.tensor([1.0]))


def test_gelu_models_get_the_table_on_every_mlp_activation():
    from tests.conftest import tiny_gemma3
    from wkvlab.engines.ggml_acts import attach_output_replacements, ggml_output_plan

    model = tiny_gemma3()
    plan = ggml_output_plan(model)
    assert sorted(plan) == [f"model.layers.{i}.mlp.act_fn" for i in range(3)] and set(plan.values()) == {"ggml-gelu-f16"}
    assert ggml_output_plan(tiny_llama()) == {}  # SiLU: float32 in ggml too
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        plain = model(ids).logits
        handles = attach_output_replacements(model, plan)
        table = model(ids).logits
        for h in handles:
            h.remove()
        assert torch.equal(model(ids).logits, plain) and not torch.equal(table, plain)
