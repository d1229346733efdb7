"""What FlashInfer's FA2 attention reads from an NVFP4 KV cache, against the simulation's exact read.

FlashInfer's FA2 prefill/decode kernel (the SM120 reader vLLM and SGLang route NVFP4 KV to;
flashinfer-ai/flashinfer ``include/flashinfer/attention/prefill.cuh`` ``compute_qk`` and
``compute_sfm_v``, added at @4e64219132b13aee43f9d516aba54160748a6feb (PR #3097), unchanged at
@fb28d7242b3506a2348265962041acc1fb56cca4) converts the E2M1 codes to the query dtype
(``vec_cast<DTypeQ, DTypeKV>``), converts each E4M3 block scale to the query dtype
(``static_cast<DTypeQ_>(sf_fp8)``) and multiplies the two in the query dtype (``__hmul2``) before the
QK^T / PV MMAs. The per-layer scales never touch an element: ``k_scale`` is folded into the softmax
scale (``sm_scale *= k_scale``) and ``v_scale`` multiplies the output (``out *= v_scale``, skipped for
a float 1.0) in ``flashinfer/prefill.py`` (``single_prefill_with_kv_cache``,
``BatchPrefillWithPagedKVCacheWrapper.run``).

So the tile equals ``code · sf`` rounded once to bf16/fp16. These tests show that rounding is nil for
every (code, scale) pair — the product has at most 6 significant bits and lies in [2^-10, 2688] — so
the simulation's ``code · sf · k_scale`` in float32 is exactly what the kernel multiplies Q by, for
k_scale 1.0 (vLLM without checkpoint scales) and 6.0 (SGLang on SM100).
"""
import pytest
import torch

from wkvlab.formats.nvfp4_kv import dequantize_nvfp4_kv, fake_quant_nvfp4_kv, quantize_nvfp4_kv

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _all_e4m3_scales() -> torch.Tensor:
    """Every finite non-negative E4M3 value (bytes 0x00..0x7E; 0x7F is NaN), as float32."""
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_code_times_every_block_scale_is_exact_in_the_query_dtype(dtype):
    codes = torch.tensor(_E2M1 + tuple(-c for c in _E2M1[1:]))
    scales = _all_e4m3_scales()
    exact = codes[:, None] * scales[None, :]  # float32: exact (≤ 6 significant bits)
    # the kernel: both operands converted to DTypeQ (exact), one product rounded in DTypeQ
    kernel = codes.to(dtype)[:, None] * scales.to(dtype)[None, :]
    assert torch.equal(codes.to(dtype).float(), codes) and torch.equal(scales.to(dtype).float(), scales)
    assert torch.equal(kernel.float(), exact)
    assert exact.abs().max().item() == 6.0 * 448.0
    assert exact[exact != 0].abs().min().item() == 0.5 * 2.0 ** -9


@pytest.mark.parametrize("k_scale", [1.0, 6.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_simulated_read_equals_the_fa2_tile_scaled_by_k_scale(dtype, k_scale):
    torch.manual_seed(0)
    x = torch.randn(4, 2, 8, 64) * 3
    codes, sf = quantize_nvfp4_kv(x, k_scale)
    blocks = codes.reshape(4, 2, 8, 4, 16)
    # FA2's K/V tile in the query dtype: code (cast) * sf (cast), one __hmul2 per element
    tile = (blocks.to(dtype) * sf.to(dtype).unsqueeze(-1)).reshape(x.shape)
    simulated = dequantize_nvfp4_kv(codes, sf, k_scale)
    # k_scale 1 or 6 times a 6-bit product is exact in float32 (and in bf16: ≤ 8 bits), so applying it
    # per element (here) or to the scores (sm_scale *= k_scale, the kernel) gives the same scores
    assert torch.equal(simulated, tile.float() * k_scale)
    # and a 16-bit run's stored K/V (one rounding of the float32 value) is that value, unrounded
    assert torch.equal(fake_quant_nvfp4_kv(x.to(dtype), k_scale).float(), dequantize_nvfp4_kv(*quantize_nvfp4_kv(x.to(dtype), k_scale), k_scale))
