"""llama.cpp's matmul-input rounding: bit-exact q8 blocks, and which linears get it from a GGUF."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from tests.conftest import tiny_llama
from wkvlab.engines.ggml_acts import ggml_activation_plan, gguf_linear_types
from wkvlab.errors import ModelError
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
    assert set(plan) == {"lm_head", "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.up_proj"}
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


def test_k_quant_weights_are_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "k.gguf"
    _tiny_gguf(path, {"token_embd.weight": GGMLQuantizationType.Q8_0, "blk.0.ffn_down.weight": GGMLQuantizationType.Q4_K})
    with pytest.raises(ModelError, match="Q4_K.*not simulated"):
        ggml_activation_plan(tiny_llama(), path)


def test_packaged_default_gguf_is_q4_1_with_a_q8_0_tied_head():
    types = gguf_linear_types(packaged_gguf("default"))
    assert len(types) == 30 * 7 + 1
    assert types.pop("lm_head") == "Q8_0"
    assert set(types.values()) == {"Q4_1"}
