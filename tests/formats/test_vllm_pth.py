"""vLLM's per-token-head int8/fp8 caches against values computed by hand from the kernel's lines.

``_reshape_cache_per_token_head`` (vllm-project/vllm, vllm/v1/attention/ops/
triton_reshape_and_cache_flash.py, as released): ``scale = max(absmax/QMAX, 1e-6)``,
``q = x * (1/scale)``; vLLM >= 0.24.0 (0.34.0 = @62d4bc3c7) then adds ``tl.where(q >= 0, q + 0.5,
q - 0.5)`` for int8; ``clamp(q, QMIN, QMAX)`` is stored into the cache dtype — int8 truncates
(fptosi), fp8 rounds to nearest even. vLLM 0.20.0-0.23.0 (0.23.0 = @91df0fad4) stored the clamp
directly: truncation (``int8_trunc``, preset ``vllm@0.23:int8_per_token_head``).
"""
import pytest
import torch

from wkvlab.formats.vllm_pth import fake_quant_vllm_per_token_head, quantize_vllm_per_token_head
from wkvlab.kv import KVSpec, get_kv_format

# absmax 127 -> scale = 127/127 = 1.0 exactly, so the codes are the inputs' own arithmetic
TIES = torch.tensor([[127.0, 62.5, -62.5, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -38.6, 12.2]])


def test_int8_store_rounds_half_away_from_zero():
    q, s = quantize_vllm_per_token_head(TIES, "int8")
    assert q.dtype == torch.int8 and s.item() == 1.0
    # q + 0.5 (q >= 0) or q - 0.5, clamp to [-128, 127], truncate: 127.5 -> 127, 63 -> 63, -63 -> -63, 1, -1, 2, 3,
    # -3; 0.49999997 + 0.5 = 1 - 2^-25 rounds to 1.0 in float32 -> 1 (exact half-away rounding would give 0);
    # -38.6 - 0.5 = -39.1 -> -39; 12.2 + 0.5 = 12.7 -> 12
    assert q[0].tolist() == [127, 63, -63, 1, -1, 2, 3, -3, 1, -39, 12]
    assert torch.equal(get_kv_format("int8_pth").quantize(TIES), q.float())


def test_int8_rounding_is_not_torch_round_nor_truncation():
    # half to even (torch.round): 62.5 -> 62, 0.5 -> 0, 2.5 -> 2; the bare store (vLLM <= 0.23) truncates
    assert quantize_vllm_per_token_head(TIES, "int8_round")[0][0].tolist() == [127, 62, -62, 0, 0, 2, 2, -2, 0, -39, 12]
    assert quantize_vllm_per_token_head(TIES, "int8_trunc")[0][0].tolist() == [127, 62, -62, 0, 0, 1, 2, -2, 0, -38, 12]
    assert torch.equal(get_kv_format("int8_pth-trunc").quantize(TIES)[0, :3], torch.tensor([127.0, 62.0, -62.0]))


def test_int8_store_with_a_non_unit_scale():
    # absmax 1 -> scale = fl32(1/127), 1/scale = 127 exactly; x/scale = 127, 63.5, -38.1, -63.5, 12.7
    x = torch.tensor([[1.0, 0.5, -0.3, -0.5, 0.1]])
    scale = torch.tensor(1.0) / 127
    q, s = quantize_vllm_per_token_head(x, "int8")
    assert s.item() == scale.item()
    assert q[0].tolist() == [127, 64, -38, -64, 13]  # 127.5 clamps to 127; 63.5 -> 64; -63.5 -> -64; 12.7 -> 13
    assert torch.equal(get_kv_format("int8_pth").quantize(x), torch.tensor([[127.0, 64.0, -38.0, -64.0, 13.0]]) * scale)
    # vLLM 0.20-0.23: trunc 63.5 -> 63, -63.5 -> -63 (not floor's -64)
    assert quantize_vllm_per_token_head(x, "int8_trunc")[0][0].tolist() == [127, 63, -38, -63, 12]
    assert torch.equal(get_kv_format("int8_pth-trunc").quantize(x), torch.tensor([[127.0, 63.0, -38.0, -63.0, 12.0]]) * scale)


@pytest.mark.parametrize("name, fmt", [("vllm:int8_per_token_head", "int8_pth"), ("vllm@0.34:int8_per_token_head", "int8_pth"),
                                       ("vllm@0.27:int8_per_token_head", "int8_pth"), ("vllm@0.23:int8_per_token_head", "int8_pth-trunc"),
                                       ("vllm@0.23.0:int8_per_token_head", "int8_pth-trunc")])
def test_preset_store_follows_the_release(name, fmt):
    spec = KVSpec.parse(name)
    assert (spec.k, spec.v) == (fmt, fmt)


def test_scale_floor_is_1e_6():
    # absmax/127 < 1e-6: the scale is 1e-6 (float32), codes round(x / 1e-6) half away (vLLM >= 0.24)
    x = torch.tensor([[5.57e-5, -2.25e-6, 0.0]])
    q, s = quantize_vllm_per_token_head(x, "int8")
    assert s.item() == torch.tensor(1e-6).item()
    assert q[0].tolist() == [56, -2, 0]  # 55.7 -> 56, -2.25 -> -2 (absmax/127 would make the first 127)
    assert quantize_vllm_per_token_head(x, "int8_trunc")[0][0].tolist() == [55, -2, 0]
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


def test_the_largest_element_can_store_126_when_truncated():
    # absmax 0.5037519: scale = fl32(a/127) = 0.0039665503, 1/scale = 252.10823, a * (1/scale) = 126.99999
    # (float32, computed with numpy) -> trunc 126: vLLM 0.20-0.23's largest element loses a step (on
    # 100k standard-normal vectors of 64 that happens to 22% of them; IEEE division here, Triton's / is
    # div.full.f32, within 2 ulp). vLLM >= 0.24 adds 0.5 first: 127.49999 -> 127.
    x = torch.tensor([[0.5037519, -0.25, 0.0, 0.1]])
    assert quantize_vllm_per_token_head(x, "int8_trunc")[0][0, 0].item() == 126
    assert quantize_vllm_per_token_head(x, "int8")[0][0, 0].item() == 127
    assert quantize_vllm_per_token_head(x, "int8_round")[0][0, 0].item() == 127
