"""NVFP4 KV caches (vLLM nvfp4 / nvfp4_4over6, SGLang's nvfp4 recipe) against values computed by hand.

The kernel lines (vllm-project/vllm csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu @0cd789b3 and
quantization/fp4/nvfp4_utils.cuh @20b4ad8e ``cvt_warp_fp16_to_fp4``; flashinfer's copy in
quantization_utils.cuh @014327ab, which SGLang's recipe calls), per block of 16, float32::

    SFValue = (1/k_scale) * (vecMax * rcp(6));  sf = e4m3(SFValue)   (nearest even, satfinite)
    outputScale = rcp(sf * k_scale);  code = e2m1_rn(x * outputScale)   (ties to even)

fl32(1/6) = 11184811 / 2^26, so vecMax * fl32(1/6) is vecMax/6 to within half an ulp for the values here.
"""
import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.formats.nvfp4_kv import RCP6_EXACT, RCP6_ONE_ULP_BELOW, dequantize_nvfp4_kv, fake_quant_nvfp4_kv, quantize_nvfp4_kv
from wkvlab.kv import get_kv_format


def _block(*values: float) -> torch.Tensor:
    return torch.tensor([list(values) + [0.0] * (16 - len(values))])


def test_e2m1_ties_go_to_the_even_mantissa():
    # amax 6: SFValue = 6 * fl32(1/6) = 1 + 2^-25 -> fl32 1.0 -> e4m3 1.0, outputScale 1: the codes are e2m1(x)
    x = _block(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 0.3, 2.9, 5.01, 4.5, 1.1)
    codes, scales = quantize_nvfp4_kv(x)
    assert scales.float()[0].tolist() == [1.0]
    want = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -4.0, 0.5, 3.0, 6.0, 4.0, 1.0]
    assert codes[0].tolist() == want
    assert get_kv_format("nvfp4").quantize(x)[0].tolist() == want
    # SGLang's MXFP4/blockfp4 recipe (fp4_e2m1) has the same scale here (2^ceil(log2(6/6)) = 1) and rounds
    # every tie up: 0.25 -> 0.5, 1.25 -> 1.5, 2.5 -> 3, 5 -> 6
    sglang_mx = get_kv_format("fp4_e2m1").quantize(x)[0].tolist()
    assert sglang_mx[1:8] == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_block_scale_rounds_to_e4m3_and_values_use_the_rounded_scale():
    # amax 1.3: SFValue = 0.21666667; e4m3 in [0.125, 0.25) steps by 2^-6: 13.87 -> 14 -> 0.21875;
    # outputScale = 1/0.21875 = 4.5714283: 1.3 -> 5.943 -> 6, 0.5 -> 2.286 -> 2, -0.9 -> -4.114 -> -4,
    # 0.1 -> 0.457 -> 0.5, 0.65 -> 2.971 -> 3
    x = _block(1.3, 0.5, -0.9, 0.1, 0.65)
    codes, scales = quantize_nvfp4_kv(x)
    assert scales.float()[0].tolist() == [0.21875]
    assert codes[0, :5].tolist() == [6.0, 2.0, -4.0, 0.5, 3.0]
    assert fake_quant_nvfp4_kv(x)[0, :5].tolist() == [1.3125, 0.4375, -0.875, 0.109375, 0.65625]
    # an E4M3 tie in the scale itself: amax 300 -> SFValue 50.0 (fl32), between 48 and 52 -> the even 48;
    # outputScale 1/48: 300 -> 6.25 -> 6 (saturates), 100 -> 2.08 -> 2
    big = _block(300.0, 100.0)
    codes, scales = quantize_nvfp4_kv(big)
    assert scales.float()[0].tolist() == [48.0]
    assert fake_quant_nvfp4_kv(big)[0, :2].tolist() == [288.0, 96.0]


def test_small_blocks_reach_e4m3_subnormals_and_zero():
    # amax 0.01: SFValue 0.0016667 -> subnormal 2^-9 = 0.001953125 (0.853 steps -> 1); outputScale 512:
    # 0.01 -> 5.12 -> 6 -> 0.01171875
    x = _block(0.01, 0.002)
    codes, scales = quantize_nvfp4_kv(x)
    assert scales.float()[0].tolist() == [2.0 ** -9]
    assert codes[0, :2].tolist() == [6.0, 1.0]
    # amax 0.003: SFValue 0.0005 < 2^-10 -> e4m3 0 -> outputScale 0: the whole block reads back as 0
    tiny = _block(0.003, -0.001)
    assert quantize_nvfp4_kv(tiny)[1].float()[0].tolist() == [0.0]
    assert fake_quant_nvfp4_kv(tiny).abs().max().item() == 0.0


def test_the_global_scale_divides_into_the_block_scale():
    # SGLang on SM100 without checkpoint scales: k_scale 6 -> SFScaleVal = fl32(1/6).
    # amax 6: SFValue = fl32(1/6) * 1.0 = 0.16666667 -> e4m3 (step 2^-6): 10.67 -> 11 -> 0.171875;
    # rcp(fl32(1/6)) = 6.0 (fl32), outputScale = 1 / (0.171875 * 6) = 1/1.03125: 6 -> 5.82 -> 6, 3 -> 2.91 -> 3;
    # read back code * 0.171875 * 6: 6.1875, 3.09375 (k_scale 1 reads 6 and 3 back exactly)
    x = _block(6.0, 3.0)
    codes, scales = quantize_nvfp4_kv(x, k_scale=6.0)
    assert scales.float()[0].tolist() == [0.171875] and codes[0, :2].tolist() == [6.0, 3.0]
    assert dequantize_nvfp4_kv(codes, scales, 6.0)[0, :2].tolist() == [6.1875, 3.09375]
    assert fake_quant_nvfp4_kv(x)[0, :2].tolist() == [6.0, 3.0]
    assert get_kv_format("nvfp4-fp8read-sm100").quantize(x)[0, :2].tolist() == [6.0, 3.0]  # then e4m3: 6.1875 -> 6 (12.375 steps of 0.5), 3.09375 -> 3


def test_four_over_six_keeps_the_scale_with_the_smaller_error():
    # [4, 3, 2, 1]: max/6 -> SFValue 0.6667 -> e4m3 (step 2^-4) 0.6875, outputScale 1.4545: codes 6, 4, 3, 1.5 ->
    # 4.125, 2.75, 2.0625, 1.03125; max/4 -> SFValue 1.0 -> exact, error 0 < the max/6 error: 4over6 stores 1.0
    x = _block(4.0, 3.0, 2.0, 1.0)
    assert fake_quant_nvfp4_kv(x)[0, :4].tolist() == [4.125, 2.75, 2.0625, 1.03125]
    codes, scales = quantize_nvfp4_kv(x, four_over_six=True)
    assert scales.float()[0].tolist() == [1.0] and codes[0, :4].tolist() == [4.0, 3.0, 2.0, 1.0]
    assert get_kv_format("nvfp4_4over6").quantize(x)[0, :4].tolist() == [4.0, 3.0, 2.0, 1.0]
    # equal errors keep max/6 (use4 = err4 < err6): [6]: max/6 scale 1.0 exact; max/4 scale 1.5, code 4 -> 6, exact too
    codes, scales = quantize_nvfp4_kv(_block(6.0), four_over_six=True)
    assert scales.float()[0].tolist() == [1.0] and codes[0, 0].item() == 6.0


def _f32(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def test_rcp6_is_an_explicit_float32_value():
    # the kernels' rcp.approx.ftz.f32(6.0f), assumed correctly rounded: 0x3E2AAAAB; the one-bit-low alternative 0x3E2AAAAA
    assert RCP6_EXACT == _f32(0x3E2AAAAB) == torch.tensor(1 / 6, dtype=torch.float32).item()
    assert RCP6_ONE_ULP_BELOW == _f32(0x3E2AAAAA)


def test_a_one_ulp_low_rcp6_moves_e4m3_ties_of_the_block_scale_down():
    # vecMax 7.125 = 6 * 1.1875, 1.1875 halfway between the E4M3 scales 1.125 (mantissa 001) and 1.25 (010).
    # exact rcp6: 7.125 * 0x3E2AAAAB = 1.1875 * (1 + 2^-25) -> fl32 1.1875, the tie -> even 1.25; outputScale 0.8:
    #   7.125 -> 5.7 -> 6 -> 7.5;  2 -> 1.6 -> 1.5 -> 1.875;  1 -> 0.8 -> 1 -> 1.25
    # 0x3E2AAAAA: 7.125 * 0x3E2AAAAA = 1.1875 * (1 - 2^-24) -> just below the tie -> 1.125; outputScale 1/1.125:
    #   7.125 -> 6.33 -> 6 -> 6.75;  2 -> 1.78 -> 2 -> 2.25;  1 -> 0.89 -> 1 -> 1.125
    x = _block(7.125, 2.0, 1.0)
    assert quantize_nvfp4_kv(x)[1].float()[0].tolist() == [1.25]
    assert fake_quant_nvfp4_kv(x)[0, :3].tolist() == [7.5, 1.875, 1.25]
    assert quantize_nvfp4_kv(x, rcp6=RCP6_ONE_ULP_BELOW)[1].float()[0].tolist() == [1.125]
    assert fake_quant_nvfp4_kv(x, rcp6=RCP6_ONE_ULP_BELOW)[0, :3].tolist() == [6.75, 2.25, 1.125]
    # 6 * 1.0625 = 6.375: the tie between 1.0 (000) and 1.125 (001) goes down to the even 1.0 either way
    y = _block(6.375, 1.0)
    assert fake_quant_nvfp4_kv(y).tolist() == fake_quant_nvfp4_kv(y, rcp6=RCP6_ONE_ULP_BELOW).tolist()


@pytest.mark.parametrize("std, changed", [(1.0, 0.0312), (0.02, 0.0085)])
def test_the_share_of_bf16_values_a_one_ulp_low_rcp6_changes(std, changed):
    # What the default rcp6 assumption is worth: exactly the blocks whose max / 6 is an E4M3 tie with an even upper
    # neighbour change (found here in float64, apart from the kernel arithmetic); on 4096 x 128 bf16 N(0, std^2) values
    # (seed 0) that is 3.12% of values for std 1 and 0.85% for std 0.02
    torch.manual_seed(0)
    x = (torch.randn(4096, 128) * std).to(torch.bfloat16)
    exact, low = fake_quant_nvfp4_kv(x), fake_quant_nvfp4_kv(x, rcp6=RCP6_ONE_ULP_BELOW)
    block_changed = (exact != low).reshape(-1, 16).any(dim=-1)
    m = x.double().reshape(-1, 16).abs().amax(dim=-1) / 6
    up, down = (m * (1 + 2.0 ** -20)).to(torch.float8_e4m3fn), (m * (1 - 2.0 ** -20)).to(torch.float8_e4m3fn)
    tie_to_upper = (up.float() != down.float()) & (m.to(torch.float8_e4m3fn).float() == up.float())
    assert torch.equal(block_changed, tie_to_upper)
    assert round((exact != low).float().mean().item(), 4) == changed


def test_sglang_fp8_read_rounds_the_dequantized_values_to_e4m3():
    # the amax-1.3 block: code * 0.21875 = 1.3125, 0.4375, -0.875, 0.109375, 0.65625; bf16 holds them exactly; e4m3:
    # 1.3125 = 10.5 steps of 0.125 -> 10 -> 1.25; 0.65625 = 10.5 steps of 2^-4 -> 10 -> 0.625; the rest are E4M3 values
    x = _block(1.3, 0.5, -0.9, 0.1, 0.65)
    assert get_kv_format("nvfp4-fp8read").quantize(x)[0, :5].tolist() == [1.25, 0.4375, -0.875, 0.109375, 0.625]


def test_shape_dtype_device_and_bytes():
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y = fake_quant_nvfp4_kv(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape and y.device == x.device
    codes, scales = quantize_nvfp4_kv(x)
    assert codes.shape == (2, 3, 64) and scales.shape == (2, 3, 4) and scales.dtype == torch.float8_e4m3fn
    for name in ("nvfp4", "nvfp4_4over6", "nvfp4-fp8read", "nvfp4-fp8read-sm100"):
        fmt = get_kv_format(name)
        assert fmt.bytes_per_vector(128) == 64 + 8 and fmt.block == 16  # nibbles + one E4M3 byte per 16
    with pytest.raises(ConfigError, match="divisible by 16"):
        quantize_nvfp4_kv(torch.zeros(1, 24))
