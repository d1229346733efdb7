"""16-bit runs hand the attention dequantized K/V as the modelled engine reads them (kv/readprec.py).

llama.cpp's CPU flash attention (ggml-org/llama.cpp@0c1e57098 ``ggml/src/ggml-cpu/ops.cpp``) keeps
q8_0 K/V in float32 (``kq_vec_dot`` / ``v_to_float``); ExLlamaV3 dequantizes to fp16; everything
else reads at the model's dtype. A float32 run is unchanged. The tiny Llama has head_dim 32, so
llama.cpp's rotation rule (multiples of 64) rotates nothing and the q8_0 values can be worked by hand.
"""
import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.formats import fake_quant_ggml
from wkvlab.kv import KVSpec, get_kv_format, kv_quantization
from wkvlab.kv.cache import QuantizeOnWriteCache
from wkvlab.kv.override import attention_override
from wkvlab.kv.readprec import engine_read_dtype, mask_to, work_dtype
from wkvlab.kv.store import LayerStore


def _run(model, ids, spec=None):
    """(logits, per-layer (query, key, value) as the model's attention backend receives them; only
    layer 0's inputs are the same with and without a KV spec)."""
    seen = {}

    def capture(backend, module, query, key, value, attention_mask, **kwargs):
        seen[module.layer_idx] = (query, key, value)
        return backend(module, query, key, value, attention_mask, **kwargs)

    with torch.no_grad(), attention_override(model, capture):
        if spec is None:
            logits = model(input_ids=ids, use_cache=False).logits
        else:
            with kv_quantization(model, spec):  # the KV hook wraps the capture: it sees what the hook passes on
                logits = model(input_ids=ids, use_cache=False).logits
    return logits, seen


def _q8_0_by_hand(block: torch.Tensor) -> torch.Tensor:
    """``quantize_row_q8_0_ref`` then dequantize (ggml-quants.c): d = amax/127 in float32, codes
    roundf(x · (1/d)) (half away from zero), value = fp16(d) · code in float32."""
    x = block.float()
    d = x.abs().max() / 127
    t = x * (1 / d)
    codes = torch.sign(t) * torch.floor(t.abs() + 0.5)
    return d.to(torch.float16).float() * codes


@pytest.fixture(scope="module")
def bf16_model():
    return tiny_llama().to(torch.bfloat16)


def _layer0(model, seed: int, text: str, read: torch.dtype):
    """Layer 0's unquantized (query, key, value) and what the backend gets under ``text``, checked to
    arrive in ``read`` while the model's logits stay bf16."""
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(seed))
    _, raw = _run(model, ids)
    logits, seen = _run(model, ids, KVSpec.parse(text))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert tuple(t.dtype for t in seen[0]) == (read,) * 3
    return raw[0], seen[0]


def test_llamacpp_bf16_run_reads_q8_0_keys_and_values_in_float32(bf16_model):
    raw, (q, k, v) = _layer0(bf16_model, 1, "llamacpp:q8_0", torch.float32)
    for got, x in ((k, raw[1]), (v, raw[2])):
        for token, head in ((0, 0), (5, 1), (11, 0)):
            want = _q8_0_by_hand(x[0, head, token])  # head_dim 32 = one q8_0 block
            assert torch.equal(got[0, head, token], want)
        # what the old path gave the attention: the same values rounded to bf16 — not what llama.cpp reads
        assert not torch.equal(got.to(torch.bfloat16).float(), got)
    # Q: llama.cpp's q8_0 conversion, kept exact (it multiplies integer codes; nothing rounds it to bf16)
    assert torch.equal(q, fake_quant_ggml(raw[0].float(), "q8_0"))


@pytest.mark.parametrize("text", ["q8_0", "vllm:fp8_e4m3"])
def test_plain_formats_and_vllm_read_at_the_model_dtype_with_one_rounding(bf16_model, text):
    raw, (_, k, v) = _layer0(bf16_model, 2, text, torch.bfloat16)
    fmt = get_kv_format(KVSpec.parse(text).k)
    # one rounding of the float32 dequantized value
    assert torch.equal(k, fmt.quantize(raw[1].float()).to(torch.bfloat16))
    assert torch.equal(v, fmt.quantize(raw[2].float()).to(torch.bfloat16))


def test_exllamav3_bf16_run_reads_fp16_as_exllamav3_does(bf16_model):
    raw, (_, k, v) = _layer0(bf16_model, 3, "exl3:k4v4", torch.float16)
    fmt = get_kv_format("exl3_4")
    # bf16 -> fp16 is exact for these values; the float32 dequantization is rounded once, to fp16
    assert torch.equal(raw[1].to(torch.float16).float(), raw[1].float())
    assert torch.equal(k, fmt.quantize(raw[1].float()).to(torch.float16))
    assert torch.equal(v, fmt.quantize(raw[2].float()).to(torch.float16))


def test_a_float32_run_is_unchanged():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    _, raw = _run(model, ids)
    preset = KVSpec.parse("llamacpp:q8_0")
    unnamed = KVSpec(k=preset.k, v=preset.v, rotate=preset.rotate, q=preset.q)  # same cache, no engine
    assert unnamed.canonical() == preset.canonical() and engine_read_dtype(unnamed.label) is None
    logits, seen = _run(model, ids, preset)
    assert torch.equal(logits, _run(model, ids, unnamed)[0])
    assert seen[0][1].dtype == torch.float32 and torch.equal(seen[0][1], fake_quant_ggml(raw[0][1], "q8_0"))
    # and in bf16 the engine's read is what separates them
    bf16 = model.to(torch.bfloat16)
    assert not torch.equal(_run(bf16, ids, preset)[0], _run(bf16, ids, unnamed)[0])


def test_the_streaming_cache_holds_the_read_dtype(bf16_model):
    spec = KVSpec.parse("llamacpp:q8_0")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), kv_quantization(bf16_model, spec, storage="cache"):
        cache = QuantizeOnWriteCache(bf16_model, spec)
        for t in range(ids.shape[1]):
            out = bf16_model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()
    assert cache.layers[0].keys.dtype == torch.float32 and cache.layers[0].keys.shape[-2] == 6


def test_work_dtype_rules_and_no_tensor_leaves_the_meta_device():
    assert engine_read_dtype("llamacpp:q4_0+norot") == torch.float32
    assert engine_read_dtype("llamacpp-x86:q8_0") == torch.float32
    assert engine_read_dtype("exl3-fa:k4v4") == torch.float16
    assert engine_read_dtype("vllm:fp8_e4m3") is None and engine_read_dtype("q8_0") is None
    assert work_dtype(torch.float32, torch.float16) == torch.float32  # float32 runs: the cache alone
    assert work_dtype(torch.bfloat16, torch.float32) == torch.float32
    assert work_dtype(torch.float16, torch.float16) == torch.float16
    assert work_dtype(torch.bfloat16, None) == torch.bfloat16
    spec = KVSpec.parse("llamacpp:q8_0")
    store = LayerStore(spec, 0, get_kv_format("q8_0"), get_kv_format("q8_0"), 32, None)
    k = torch.empty(1, 2, 5, 32, dtype=torch.bfloat16, device="meta")
    key, value = store.key_value_side(k, k)
    assert (key.device.type, key.dtype, value.dtype) == ("meta", torch.float32, torch.float32)
    mask = torch.full((1, 1, 5, 5), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16)
    assert torch.isfinite(mask_to(mask, torch.float16)).all()  # bf16's minimum is -inf in fp16: clamped
    assert mask_to(mask.bool(), torch.float32).dtype == torch.bool
    # a layer that quantizes nothing keeps the model's dtype, so identity stays bit-exact
    plain = LayerStore(spec, 0, get_kv_format("fp16"), get_kv_format("fp16"), 32, None)
    assert plain.work_dtype(torch.bfloat16) == torch.bfloat16


def test_the_chunked_path_holds_the_read_dtype_and_agrees_with_the_whole_window(bf16_model):
    from wkvlab.eval.chunks import WindowPass
    from wkvlab.eval.logits import model_logits
    from wkvlab.kv.hook import layer_stores

    spec = KVSpec.parse("llamacpp:q8_0")
    tokens = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(6))
    stores = layer_stores(bf16_model, spec)
    pass_ = WindowPass(bf16_model, spec, stores)
    chunked = torch.cat([pass_.step(tokens[:6]), pass_.step(tokens[6:])])
    assert pass_.cache.layers[0].keys.dtype == torch.float32
    with torch.no_grad(), kv_quantization(bf16_model, spec, stores=stores):
        whole = model_logits(bf16_model, tokens[None], use_cache=False)
    # the same K/V and attention dtype on both paths; only the bf16 projections see other shapes
    assert torch.allclose(chunked, whole, atol=5e-3)  # 4.6e-4 here, on logits of about 0.2
