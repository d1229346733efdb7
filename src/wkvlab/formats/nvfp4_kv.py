"""NVFP4 KV caches as vLLM and SGLang write them: E2M1 values, an FP8-E4M3 scale per 16, an fp32 scale per layer.

**The store** — vLLM ``--kv-cache-dtype nvfp4`` (``reshape_and_cache_nvfp4_kernel``,
vllm-project/vllm ``csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu``
@0cd789b397efc1a8992489076db9fe28d41aed69, which calls ``cvt_warp_fp16_to_fp4`` of
``csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh`` @20b4ad8eb93309fce4bc0a069adcd2cfabb462f7)
and SGLang ``--kv-cache-dtype nvfp4`` (older main: ``--fp4-kv-cache-recipe nvfp4``; ``NVFP4Method.quantize_and_store`` →
``NVFP4QuantizeUtil.fi_nvfp4_quantize`` → flashinfer ``fp4_quantize(x, 1/global_scale,
sf_vec_size=16)``, sgl-project/sglang @1c5f9e23874acd43238a31da1d3d2b17fae45c24
``python/sglang/srt/layers/quantization/kvfp4_tensor.py``; flashinfer-ai/flashinfer
``csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh`` @014327abdb4aa862b062a9cc691840af2736d6f9
``cvt_warp_fp16_to_fp4``, the same lines; SGLang 0.5.23 on SM100/SM120: ``NVFP4KVQuantizeUtil.quantize`` →
flashinfer ``nvfp4_kv_quantize(x, k_scale)`` of flashinfer-python 0.7.2, the version it pins,
``csrc/fp4_kv_quantization.cu`` ``quantize_fp16_to_e2m1_with_scaling``: ``SFValue = rcp(k_scale) *
(vecMax * rcp(6))``, ``outputScale = vecMax != 0 ? rcp(sf * k_scale) : 0`` — the same values for
k_scale 1.0; where sf rounds to 0 it stores ``x * rcp(0)`` codes, read back as 0 all the same)
compute, per block of 16 consecutive values of one
token's head vector, in float32::

    SFScaleVal  = 1 / k_scale                              # k_scale: the layer's fp32 scale
    SFValue     = SFScaleVal * (vecMax * rcp(6))           # vecMax = max |x| of the block
    sf          = e4m3(SFValue)                            # __nv_fp8_e4m3(): nearest even, satfinite (448)
    outputScale = sf != 0 ? rcp(float(sf) * rcp(SFScaleVal)) : 0
    code        = cvt.rn.satfinite.e2m1(x * outputScale)   # nearest, ties to even, saturating at 6

and store the nibbles (D/2 bytes), the E4M3 block scales (D/16 bytes) and, per layer and side, the
fp32 ``k_scale`` / ``v_scale``. A reader recovers ``code · sf · k_scale``.

* **Tie rule**: E2M1 ties go to the even mantissa: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2,
  2.5 → 2, 3.5 → 4, 5 → 4 (``round_to_nearest_e2m1`` in the same .cu file transcribes
  ``cvt.rn.satfinite.e2m1x2.f32`` exactly so) — unlike SGLang's MXFP4/blockfp4 recipe, whose
  ``sum(|x| >= bounds)`` rounds ties up (:func:`wkvlab.kv.formats._sglang_fp4`).
* **Global scale**: ``k_scale`` is the checkpoint's (1.0 without one); SGLang's
  ``NVFP4Method.load_scales_from_model`` multiplied it by 6 on SM100 ("to align FP4 range with
  hardware expectations") up to 0.5.20, so a B200 without checkpoint scales ran with ``k_scale = 6``:
  block scales 6× smaller, E4M3 subnormals (below 2^-6) reached 6× sooner (``nvfp4-sm100``). From
  0.5.21 (the sglang-0.5.23 wheel's ``fp4_kv_cache_quant_method.py``: ``if is_sm100 and k_scale != 1.0``)
  only a checkpoint's scale is multiplied: an uncalibrated model keeps 1.0 on SM100 too.
* **nvfp4_4over6** (vLLM ``cvt_warp_fp16_to_fp4_4over6``): the same store computed with
  denominators 6 and 4, each block keeping the one whose squared reconstruction error
  ``Σ (e2m1(x·os)·rcp(os) − x)²`` is smaller (6 on a tie: ``use4 = err4 < err6``).
* **SGLang's reads**: a decoding query reads the codes through FlashInfer as vLLM's read below
  (sgl-project/sglang@1c5f9e23 ``flashinfer_backend.py`` ``forward_decode``: raw codes and block scales,
  k_scale on the softmax scale), so it sees ``code · sf · k_scale`` exactly. An extend over a cached
  prefix instead (``NVFP4Method.dequantize_prev_kv``) has the cache dequantized to bf16
  (``cuda_nvfp4_dequantize``: ``code · sf · global``) and cast ``.to(torch.float8_e4m3fn)`` into
  the FP8 workspace the prefill attends to: ``fp8_read=True`` adds both roundings. SGLang notes
  that values beyond ±448 become NaN there; here they saturate, as torch 2.13's cast does
  (:func:`wkvlab.formats.fp8.fake_quant_fp8`; older torch casts give NaN above 464).

**vLLM's read** is taken as exact ``code · sf · k_scale`` in float32, and for SM120 that is what the
kernel computes: FlashInfer's FA2 kernel (flashinfer-ai/flashinfer
``include/flashinfer/attention/prefill.cuh`` ``compute_qk`` / ``compute_sfm_v`` @fb28d724, added in
PR #3097 @4e642191) casts codes and block scales to the query dtype and multiplies them there
(``__hmul2``), which is exact (≤ 6 significant bits, magnitudes in [2^-10, 2688]), and applies
k_scale to the softmax scale and v_scale to the output (``flashinfer/prefill.py``), never per element
(``tests/formats/test_nvfp4_kv_read.py``). SM100's trtllm-gen kernels are downloaded cubins
(``gen_trtllm_gen_fmha_module`` in ``flashinfer/jit/attention/modules.py``): not read.

**rcp(6) is data, not a fact read off a GPU.** Every store above (vLLM's ``nvfp4_utils.cuh``
``SFValue = SFScaleVal * (vecMax * reciprocal_approximate_ftz(6.0f))``, flashinfer 0.7.2's
``csrc/fp4_kv_quantization.cu`` ``reciprocal_approximate_ftz(global_scale) * (vecMax *
reciprocal_approximate_ftz(6.0f))``) gets 1/6 from ``asm volatile("rcp.approx.ftz.f32 ...")``,
which the compiler cannot fold: the GPU's MUFU reciprocal computes it at run time, and the PTX ISA
promises only an approximation. No public source read here (vLLM, flashinfer, TensorRT-LLM) states
the value it returns for 6.0, and no GPU was available to measure it. :data:`RCP6_EXACT` (float32
0x3E2AAAAB, the correctly rounded 1/6) is assumed by default; ``rcp6=`` takes another value, e.g.
:data:`RCP6_ONE_ULP_BELOW` (0x3E2AAAAA). Why it matters: 6·0x3E2AAAAB = 1 + 2^-25, so a block
maximum of exactly 6·m, m halfway between two E4M3 scales (bf16 holds every such 6·m), lands on the
tie and goes to the even scale; 6·0x3E2AAAAA = 1 − 2^-24 puts it just below and it goes down —
e.g. vecMax 7.125: scale 1.25 (exact) or 1.125 (one ulp below). On 4096×128 bf16 N(0,1) values 3.12% of
values change, 0.85% for N(0, 0.02²) (``tests/formats/test_nvfp4_kv.py``).

Not modelled: the other ``rcp.approx.ftz`` calls (rcp(k_scale), rcp(sf·…)) are taken as the
correctly rounded reciprocal (rcp(1) with the default scales; rcp(sf) feeds only the E2M1
rounding; flashinfer's rcp(k_scale) for ``nvfp4-sm100``'s k_scale 6 is that same rcp(6), here
IEEE 1/6 whatever ``rcp6`` says — ``rcp6`` moves only the ``vecMax`` factor), and the 4-over-6 error sum is added in one order (the kernel's two-thread shuffle adds
in another; only near-equal errors can flip).
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor
from wkvlab.formats.fp4 import round_e2m1
from wkvlab.formats.sizes import NVFP4_KV_BLOCK, nvfp4_kv_bytes_per_vector  # noqa: F401 - sizes live torch-free
_E4M3_MAX = 448.0
# rcp.approx.ftz.f32(6.0f) as the store kernels use it (see the module docstring): assumed correctly rounded.
RCP6_EXACT = 0.16666667163372040  # float32 0x3E2AAAAB = 11184811 / 2^26
RCP6_ONE_ULP_BELOW = 0.16666665673255920  # float32 0x3E2AAAAA: the alternative if the GPU's rcp is one bit low
RCP4 = 0.25  # rcp(4.0f) for 4-over-6: a power of two


def _scale(k_scale: float | Tensor, ref: Tensor) -> Tensor:
    """The per-layer scale as float32 on ``ref``'s device (a Python number is filled there: no host copy)."""
    if isinstance(k_scale, Tensor):
        return k_scale.to(device=ref.device, dtype=torch.float32)
    return torch.full((), float(k_scale), dtype=torch.float32, device=ref.device)


def _rcp(x: Tensor) -> Tensor:
    """``rcp.approx.ftz.f32`` taken as IEEE 1/x in float32 (0 stays the caller's business)."""
    return torch.reciprocal(x)


def _candidate(vec_max: Tensor, sf_scale: Tensor, rcp_denominator: float) -> tuple[Tensor, Tensor]:
    """``(sf as float32, outputScale)`` of ``nvfp4_candidate_scale`` / ``cvt_warp_fp16_to_fp4``;
    ``rcp_denominator`` is the kernel's rcp(6.0f) (or rcp(4.0f)) as a float32 value."""
    rcp_den = torch.full((), rcp_denominator, dtype=torch.float32, device=vec_max.device)
    sf_value = sf_scale * (vec_max * rcp_den)
    sf = sf_value.clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn).float()  # satfinite, nearest even
    output_scale = torch.where(sf != 0, _rcp(sf * _rcp(sf_scale)), torch.zeros_like(sf))
    return sf, output_scale


def quantize_nvfp4_kv(x: Tensor, k_scale: float | Tensor = 1.0, four_over_six: bool = False,
                      rcp6: float = RCP6_EXACT) -> tuple[Tensor, Tensor]:
    """``(codes, block_scales)`` of ``x`` (``[..., head_dim]``): codes are the E2M1 values as
    float32 (``[..., head_dim]``, in ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}), block scales float8_e4m3fn
    (``[..., head_dim / 16]``); ``x ≈ code · scale · k_scale``. Device and shape follow ``x``.
    ``rcp6``: the value the GPU's rcp.approx.ftz.f32 gives for 6.0 (assumed exact; module docstring)."""
    check_float_tensor(x)
    dim = x.shape[-1]
    if dim % NVFP4_KV_BLOCK:
        raise ConfigError(f"NVFP4 KV caches need head_dim divisible by {NVFP4_KV_BLOCK}, got {dim}; use another KV format")
    blocks = x.float().reshape(*x.shape[:-1], dim // NVFP4_KV_BLOCK, NVFP4_KV_BLOCK)
    g = _scale(k_scale, x)
    sf_scale = _rcp(g)  # SFScaleVal = 1 / k_scale
    vec_max = blocks.abs().amax(dim=-1, keepdim=True)
    sf, output_scale = _candidate(vec_max, sf_scale, rcp6)
    if four_over_six:
        sf4, output_scale4 = _candidate(vec_max, sf_scale, RCP4)

        def error(scale: Tensor) -> Tensor:
            dequant = torch.where(scale != 0, _rcp(scale), torch.zeros_like(scale))
            err = torch.where(scale != 0, round_e2m1(blocks * scale) * dequant - blocks, blocks)
            return (err * err).sum(dim=-1, keepdim=True)

        use4 = error(output_scale4) < error(output_scale)
        sf = torch.where(use4, sf4, sf)
        output_scale = torch.where(use4, output_scale4, output_scale)
    codes = round_e2m1(blocks * output_scale)
    return codes.reshape(x.shape), sf.squeeze(-1).to(torch.float8_e4m3fn)


def dequantize_nvfp4_kv(codes: Tensor, block_scales: Tensor, k_scale: float | Tensor = 1.0) -> Tensor:
    """``code · scale · k_scale`` in float32 (exact: a code times an E4M3 scale has ≤ 6 significant bits)."""
    dim = codes.shape[-1]
    blocks = codes.float().reshape(*codes.shape[:-1], dim // NVFP4_KV_BLOCK, NVFP4_KV_BLOCK)
    g = _scale(k_scale, codes)
    return (blocks * block_scales.float().unsqueeze(-1) * g).reshape(codes.shape)


def fake_quant_nvfp4_kv(x: Tensor, k_scale: float | Tensor = 1.0, four_over_six: bool = False, fp8_read: bool = False,
                        rcp6: float = RCP6_EXACT) -> Tensor:
    """``x`` as the cache returns it, in ``x``'s dtype. ``fp8_read``: SGLang's read into its FP8
    workspace — bf16 first, then E4M3 (nearest even, saturating here)."""
    codes, scales = quantize_nvfp4_kv(x, k_scale, four_over_six, rcp6)
    y = dequantize_nvfp4_kv(codes, scales, k_scale)
    if fp8_read:
        y = y.to(torch.bfloat16).float().clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).float()
    return y.to(x.dtype)
