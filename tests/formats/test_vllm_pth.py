"""vLLM's per-token-head int8/fp8 caches against values computed by hand from the kernel's lines.

``_reshape_cache_per_token_head`` (vllm-project/vllm, vllm/v1/attention/ops/
triton_reshape_and_cache_flash.py; store line as at @027e07f2): ``scale = max(absmax/QMAX, 1e-6)``,
``q = clamp(x * (1/scale), QMIN, QMAX)`` stored into the cache dtype — int8 truncates (fptosi),
fp8 rounds to nearest even.
"""
import torch

from wkvlab.formats.vllm_pth import fake_quant_vllm_per_token_head, quantize_vllm_per_token_head
from wkvlab.kv import get_kv_format


def test_int8_store_truncates_toward_zero():
    # absmax 1 -> scale = fl32(1/127), 1/scale = 127 exactly; x/scale = 127, 63.5, -38.1, -63.5, 12.7
    x = torch.tensor([[1.0, 0.5, -0.3, -0.5, 0.1]])
    scale = torch.tensor(1.0) / 127
    q, s = quantize_vllm_per_token_head(x, "int8")
    assert q.dtype == torch.int8 and s.item() == scale.item()
    assert q[0].tolist() == [127, 63, -38, -63, 12]  # trunc: 63.5 -> 63, -63.5 -> -63 (not floor's -64)
    want = torch.tensor([[127.0, 63.0, -38.0, -63.0, 12.0]]) * scale
    assert torch.equal(get_kv_format("int8_pth").quantize(x), want)
    # the named rounding variant: same scale, half to even (63.5 -> 64, -63.5 -> -64, 12.7 -> 13)
    assert quantize_vllm_per_token_head(x, "int8_round")[0][0].tolist() == [127, 64, -38, -64, 13]
    assert torch.equal(get_kv_format("int8_pth-round").quantize(x), torch.tensor([[127.0, 64.0, -38.0, -64.0, 13.0]]) * scale)


def test_scale_floor_is_1e_6():
    # absmax/127 < 1e-6: the scale is 1e-6 (float32), codes trunc(x / 1e-6)
    x = torch.tensor([[5.57e-5, -2.25e-6, 0.0]])
    q, s = quantize_vllm_per_token_head(x, "int8")
    assert s.item() == torch.tensor(1e-6).item()
    assert q[0].tolist() == [55, -2, 0]  # 55.7 -> 55, -2.25 -> -2 (absmax/127 would make the first 127)
    assert fake_quant_vllm_per_token_head(torch.zeros(1, 8), "int8").abs().max().item() == 0.0


def test_fp8_per_token_head_rounds_and_floors():
    # absmax 2 -> scale 2/448; x/scale = 448, 224, 67.2 -> e4m3 (step 8 in [64, 128)) 64
    x = torch.tensor([[2.0, 1.0, 0.3]])
    scale = torch.tensor(2.0) / 448
    q, s = quantize_vllm_per_token_head(x, "fp8")
    assert q.dtype == torch.float8_e4m3fn and s.item() == scale.item()
    assert q.float()[0].tolist() == [448.0, 224.0, 64.0]
    assert torch.equal(get_kv_format("fp8_pth").quantize(x), torch.tensor([[448.0, 224.0, 64.0]]) * scale)
    # the 1e-6 floor: 3.3e-6 / 1e-6 = 3.3 -> 3.25 (step 0.25 in [2, 4)); absmax/448 would give 147.84 -> 144
    tiny = torch.tensor([[1e-5, 3.3e-6]])
    assert get_kv_format("fp8_pth").quantize(tiny)[0, 1].item() == (torch.tensor(3.25) * torch.tensor(1e-6)).item()


def test_the_largest_element_can_store_126():
    # absmax 0.5037519: scale = fl32(a/127) = 0.0039665503, 1/scale = 252.10823, a * (1/scale) = 126.99999
    # (float32, computed with numpy) -> trunc 126: the kernel's own largest element loses a step. On
    # 100k standard-normal vectors of 64 that happens to 22% of them (IEEE division; Triton's / is
    # div.full.f32, within 2 ulp, so the share on a GPU can differ).
    x = torch.tensor([[0.5037519, -0.25, 0.0, 0.1]])
    q, _ = quantize_vllm_per_token_head(x, "int8")
    assert q[0, 0].item() == 126
    assert quantize_vllm_per_token_head(x, "int8_round")[0][0, 0].item() == 127
