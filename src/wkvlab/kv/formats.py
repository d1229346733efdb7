"""KV-cache element formats: how one token's key or value vector of one head is stored.

Every format here quantizes each (token, head) vector on its own — no statistics cross tokens —
so a teacher-forced pass sees exactly what a streaming engine holds when it generates each token
(the current token's own K/V included: engines write it to the cache before attending, so it is
quantized too). Everything that depends on *which* tokens or layers are quantized (sinks, residual
windows, skipped layers, rotation) lives in :class:`wkvlab.kv.spec.KVSpec`.

| name        | storage per (token, head) of head_dim D          | as in |
|-------------|--------------------------------------------------|-------|
| fp16        | model precision, untouched (identity; also ``bf16``, ``auto``) | vLLM ``auto``, llama.cpp ``f16`` |
| fp8_e4m3    | D bytes, per-tensor scale 1.0 (clamp at ±448)    | vLLM ``fp8_e4m3`` without calibrated scales |
| fp8_e5m2    | D bytes, per-tensor scale 1.0 (clamp at ±57344)  | vLLM ``fp8_e5m2`` |
| fp8_e5m2-nosat | fp8_e5m2 as torch's ``.to(float8_e5m2)`` casts: ±inf from ±61440, no saturation | SGLang ``fp8_e5m2`` (``set_kv_buffer``) |
| int8        | D bytes + fp16 scale, symmetric absmax/127       | per-token-head INT8 |
| int4, int2  | D·b/8 bytes + fp16 scale + fp16 minimum (asym)   | HF QuantizedCache / KIVI's V path |
| int<b>-g<G>[-sym/-asym] | groups of G along D, fp16 scale (+ min) each | exllamav3-style grouping |
| q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl | llama.cpp blocks of 32 along D  | llama.cpp ``-ctk/-ctv <type>`` (reference quantizers) |
| q8_0-x86    | q8_0 as llama.cpp's x86 AVX/AVX2 ``quantize_row_q8_0`` writes it (``127/max``, ties to even) | llama.cpp ``-ctk q8_0`` on x86 CPUs (:mod:`wkvlab.formats.ggml_x86`) |
| int8_pth, fp8_pth | D bytes + fp32 scale per token and head (max(absmax/127, 1e-6), max(absmax/448, 1e-6)); int8 codes rounded half away from zero (+-0.5 in float32, then the store's truncation) | vLLM ``int8_per_token_head`` (0.24.0 to 0.34.0), ``fp8_per_token_head`` (:mod:`wkvlab.formats.vllm_pth`) |
| int8_pth-trunc | int8_pth's scale, codes truncated toward zero (the bare store) | vLLM 0.20.0-0.23.0 ``int8_per_token_head`` (``vllm@0.23:``) |
| int8_pth-round | int8_pth with codes rounded half to even | not an engine: differs from int8_pth on exact ties only |
| int4_pth    | D/2 bytes + fp32 scale/zero point: randomized Hadamard over the head, asymmetric INT4 | vLLM ``int4_per_token_head`` (:mod:`wkvlab.formats.vllm_int4`) |
| exl3_<b>    | b bits per value + fp16 scale per 32: H32-rotated groups on a midpoint grid | ExLlamaV3 cache (:mod:`wkvlab.formats.exl3`) |
| exl3rn_<b>  | the same on the rounding grid of ExLlamaV3 0.0.x (lrintf, levels (q - m)/m) | ExLlamaV3 0.0.28's cache (exl3-fa@0.0.28) |
| int<b>-c<G>[-sym/-asym] | per CHANNEL, groups of G consecutive tokens; fp16 scale + min per channel and group | KIVI's keys |
| fp4_e2m1    | E2M1 values, blocks of 16 along D with a power-of-two (UE8M0) scale rounded up (ties up) | SGLang ``--kv-cache-dtype fp4_e2m1`` (recipes mxfp4, blockfp4) |
| nvfp4, nvfp4_4over6 | E2M1 values (ties to even), FP8-E4M3 scale per 16, fp32 k_scale per layer (1.0); 4over6 picks max/6 or max/4 per block | vLLM ``--kv-cache-dtype nvfp4``, ``nvfp4_4over6`` (:mod:`wkvlab.formats.nvfp4_kv`) |
| nvfp4-sm100 | nvfp4 with k_scale 6 (SGLang <= 0.5.20 multiplies an uncalibrated model's scales by 6 on SM100), read exactly | SGLang 0.5.20 ``--kv-cache-dtype nvfp4`` decoding on SM100 (``nvfp4``: on SM120, and on SM100 from 0.5.21) |
| nvfp4-fp8read[-sm100] | nvfp4's store, read back through bf16 into SGLang's FP8-E4M3 workspace; -sm100: k_scale 6 | SGLang's extend over a cached prefix with recipe nvfp4 (``dequantize_prev_kv``) |
| nuq<b>-c, nuq<b> | b-bit non-uniform codebook; keys per channel (static calibrated ranges), values per token (+4 B range) | KVQuant |
| quanto<b>   | b ∈ {2, 4}: optimum-quanto's qint<b> in groups of 64 along head_dim, every operation in the cache's dtype (float32: ``int<b>-g64-asym``) | transformers ``QuantizedCache(backend="quanto")`` (:mod:`wkvlab.formats.quanto`) |
| hqq<b>[-g<G>] | b ∈ {1, 2, 3, 4, 8} bits, groups of G (64) values taken across the WHOLE cache (HQQ axis 0), scale + zero in the cache dtype per group, HQQ's proximal zero-point solver; re-quantized whole at every flush | transformers ``QuantizedCache(backend="hqq")`` (:mod:`wkvlab.formats.hqq`) |

HQQ's formats are the other exception: transformers' ``QuantizedCache`` hands hqq the whole cache,
whose axis-0 groups mix tokens and heads and change with the cache's length, and its early stop
looks at the whole tensor; they need ``residual=R`` and are re-quantized whole at each flush
(:mod:`wkvlab.kv.requant`).

Per-channel formats (``-c<G>``) are the exception to "each token on its own": a group's scale
depends on all G tokens, so a query may only see a group quantized once the group is complete.
:class:`~wkvlab.kv.spec.KVSpec` enforces that through its residual (flush) selection.

Low-bit integers default to asymmetric because symmetric 2-bit keeps only three useful levels.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from wkvlab.errors import ConfigError
from wkvlab.formats.sizes import (EXL3_GROUP, GGML_TYPES, NVFP4_KV_BLOCK, exl3_bytes_per_vector, ggml_block_shape, nvfp4_kv_bytes_per_vector,
                                  vllm_int4_bytes_per_vector)

if TYPE_CHECKING:
    import torch


def _kernels():
    """The tensor kernels, imported when a format first quantizes: names, bytes and specs stay torch-free."""
    import wkvlab.formats as kernels

    return kernels


@dataclass(frozen=True)
class KVFormat:
    name: str
    description: str
    quantize: Callable[[torch.Tensor], torch.Tensor] | None  # None: identity
    bytes_per_vector: Callable[[int], float]  # head_dim -> bytes for one token of one head
    block: int | None = None  # values per block/group along head_dim, when the format has one
    token_group: int | None = None  # per-channel formats: tokens per group along the token axis
    calibrated: bool = False  # the quantizer is built from calibration statistics (KVQuant codebooks)
    requantizes: bool = False  # quantizes the whole cache at once and again at every flush (HQQ's QuantizedCache)

    @property
    def is_identity(self) -> bool:
        return self.quantize is None

    def check_head_dim(self, head_dim: int) -> None:
        if self.block is not None and head_dim % self.block:
            if self.requantizes:
                raise ConfigError(f"KV format {self.name}'s group of {self.block} values must divide head_dim {head_dim} "
                                  f"(so every cache length fills whole groups); use a group size that divides {head_dim}")
            raise ConfigError(
                f"KV format {self.name} quantizes groups of {self.block} along head_dim, which does not divide head_dim {head_dim}; "
                f"use a group size that divides {head_dim}"
            )


def _affine(bits: int, symmetric: bool, group: int | None = None):
    zero_point = "int" if symmetric else "float"
    return lambda x: _kernels().fake_quant_affine(x, bits, group_size=group, symmetric=symmetric, zero_point=zero_point)


def _affine_format(bits: int, group: int | None, symmetric: bool) -> KVFormat:
    """``int<b>[-g<G>][-sym|-asym]``: per token and head, optionally in groups of G along head_dim."""
    name = f"int{bits}" + (f"-g{group}" if group else "") + ("-sym" if symmetric else "-asym")
    side = 2.0 if symmetric else 4.0  # fp16 scale (+ fp16 minimum when asymmetric) per group

    def nbytes(d: int) -> float:
        return d * bits / 8 + side * (d // group if group else 1)

    kind = "symmetric" if symmetric else "asymmetric"
    where = f"groups of {group} along head_dim" if group else "per token and head"
    return KVFormat(name, f"INT{bits} {kind}, {where}", _affine(bits, symmetric, group), nbytes, group)


def _per_channel(bits: int, group: int, symmetric: bool):
    """Quantize ``[..., tokens, head_dim]`` per channel over complete groups of ``group`` tokens.

    The trailing incomplete group is left as is: a streaming cache still holds those tokens at full
    precision, and the query selection never shows them quantized.
    """
    zero_point = "int" if symmetric else "float"

    def quantize(x: torch.Tensor) -> torch.Tensor:
        import torch

        fake_quant_affine = _kernels().fake_quant_affine
        complete = x.shape[-2] // group * group
        if complete == 0:
            return x.clone()
        head = x[..., :complete, :].transpose(-1, -2)
        head = _kernels().fake_quant_affine(head, bits, group_size=group, symmetric=symmetric, zero_point=zero_point).transpose(-1, -2)
        return torch.cat([head.to(x.dtype), x[..., complete:, :]], dim=-2)

    return quantize


def _per_channel_format(bits: int, group: int, symmetric: bool) -> KVFormat:
    name = f"int{bits}-c{group}" + ("-sym" if symmetric else "-asym")
    side = 2.0 if symmetric else 4.0  # per channel and group of tokens: fp16 scale (+ fp16 min)
    kind = "symmetric" if symmetric else "asymmetric"
    return KVFormat(
        name, f"INT{bits} {kind} per channel, groups of {group} tokens", _per_channel(bits, group, symmetric),
        lambda d: d * bits / 8 + side * d / group, None, group,
    )


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _sglang_fp4(x: torch.Tensor) -> torch.Tensor:
    """SGLang's block FP4 cache (``FP4MXBlock16KVQuantizeUtil.batched_quantize``, sgl-project/sglang
    @0dae407b ``python/sglang/srt/layers/quantization/kvfp4_tensor.py``): blocks of 16, scale
    ``2^ceil(log2(max(amax/6, 1e-10)))`` stored as a uint8 exponent, so nothing saturates; the
    magnitude is ``sum(|x|/scale >= E2M1_BOUNDS)`` — a value exactly on a midpoint takes the UPPER
    E2M1 value (``bucketize(right=True)`` counts the same bounds). The function is ``torch.compile``d,
    so Inductor keeps the pointwise chain in float32 even for bf16 inputs, as here."""
    import torch

    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / 6.0, min=1e-10))))
    scaled = blocks / scale
    from wkvlab.formats._checks import device_constant

    grid, bounds = device_constant("sglang_e2m1", x.device, lambda d: (torch.tensor(_E2M1_VALUES, device=d), torch.tensor(_E2M1_BOUNDS, device=d)))
    values = grid[torch.bucketize(scaled.abs().contiguous(), bounds, right=True)]
    return (torch.sign(scaled) * values * scale).reshape(x.shape).to(x.dtype)


def _needs_calibration(x: torch.Tensor) -> torch.Tensor:
    raise ConfigError("non-uniform (nuq) KV formats are fitted on calibration text; run them through wkvlab eval")


def _nuq_format(bits: int, per_channel: bool) -> KVFormat:
    """KVQuant's non-uniform codebooks (see :mod:`wkvlab.kv.kvquant`): ``nuq<b>-c`` for keys
    (per channel, static calibrated ranges, pre-RoPE), ``nuq<b>`` for values (per token)."""
    if per_channel:
        return KVFormat(f"nuq{bits}-c", f"{bits}-bit non-uniform codebook, per channel (KVQuant keys)", _needs_calibration,
                        lambda d: d * bits / 8, calibrated=True)
    return KVFormat(f"nuq{bits}", f"{bits}-bit non-uniform codebook, per token (KVQuant values)", _needs_calibration,
                    lambda d: d * bits / 8 + 4.0, calibrated=True)


def _vllm_pth(kind: str):
    """vLLM's per-token-head store (:mod:`wkvlab.formats.vllm_pth`): ``int8`` rounds half away (vLLM >= 0.24),
    ``int8_trunc`` truncates (vLLM 0.20-0.23), ``fp8`` rounds to nearest even."""

    def quantize(x: torch.Tensor) -> torch.Tensor:
        from wkvlab.formats.vllm_pth import fake_quant_vllm_per_token_head

        return fake_quant_vllm_per_token_head(x, kind)

    return quantize


def _ggml(type_name: str) -> KVFormat:
    values, nbytes = ggml_block_shape(type_name)
    # llama.cpp quantizes cache rows at runtime without iq4_nl's scale search (ntry = -1).
    ntry = -1 if type_name == "iq4_nl" else 7
    return KVFormat(
        type_name, f"llama.cpp {type_name} blocks of {values} ({nbytes} bytes)",
        lambda x: _kernels().fake_quant_ggml(x, type_name, ntry=ntry), lambda d: d / values * nbytes, values,
    )


def _q8_0_x86(x: "torch.Tensor") -> "torch.Tensor":
    from wkvlab.formats.ggml_x86 import fake_quant_q8_0_x86

    return fake_quant_q8_0_x86(x)


def _exl3_kernel():
    import wkvlab.formats.exl3 as exl3

    return exl3


def _quanto_format(bits: int) -> KVFormat:
    """``quanto<b>``: optimum-quanto's qint<b> in groups of 64 along head_dim (QuantoQuantizedLayer's axis 0,
    q_group_size 64), computed in the cache's dtype as quanto does (:mod:`wkvlab.formats.quanto`); in float32
    the same values as ``int<b>-g64-asym``. Bytes: b bits of code plus a scale and a shift in the cache dtype
    (2 bytes each) per group."""

    def quantize(x: "torch.Tensor") -> "torch.Tensor":
        from wkvlab.formats.quanto import fake_quant_quanto

        return fake_quant_quanto(x, bits, 64)

    return KVFormat(f"quanto{bits}", f"optimum-quanto qint{bits}, groups of 64 along head_dim, arithmetic in the cache dtype",
                    quantize, lambda d: d * bits / 8 + 4.0 * d / 64, 64)


HQQ_BITS = (1, 2, 3, 4, 8)  # HQQQuantizedLayer's nbits check (transformers 5.24 cache_utils.py)


def _hqq_format(bits: int, group: int) -> KVFormat:
    """``hqq<b>[-g<G>]``: hqq's ``Quantizer`` with axis 0 (transformers' default) on the whole cache.

    Bytes per value: b bits of code (3-bit codes: 10 per int32, 3.2 bits), plus a scale and a zero in
    the cache dtype (2 bytes each) per group of G."""

    def quantize(x: "torch.Tensor") -> "torch.Tensor":
        from wkvlab.formats.hqq import fake_quant_hqq

        return fake_quant_hqq(x, bits, group, axis=0)

    code_bits = 3.2 if bits == 3 else bits
    return KVFormat(f"hqq{bits}-g{group}", f"HQQ {bits}-bit, groups of {group} across the cache (axis 0), re-quantized at each flush",
                    quantize, lambda d: d * code_bits / 8 + 4.0 * d / group, group, requantizes=True)


def _nvfp4(k_scale: float, four_over_six: bool = False, fp8_read: bool = False):
    """The NVFP4 KV store of vLLM / SGLang (:mod:`wkvlab.formats.nvfp4_kv`) with a fixed per-layer scale."""

    def quantize(x: "torch.Tensor") -> "torch.Tensor":
        from wkvlab.formats.nvfp4_kv import fake_quant_nvfp4_kv

        return fake_quant_nvfp4_kv(x, k_scale, four_over_six=four_over_six, fp8_read=fp8_read)

    return quantize


def _vllm_int4(x: "torch.Tensor") -> "torch.Tensor":
    from wkvlab.formats.vllm_int4 import fake_quant_vllm_int4

    return fake_quant_vllm_int4(x)


KV_FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat("fp16", "16-bit cache at model precision (no quantization)", None, lambda d: 2.0 * d),
        KVFormat("fp8_e4m3", "FP8 E4M3, per-tensor scale 1.0", lambda x: _kernels().fake_quant_fp8(x, "e4m3", 1.0), lambda d: 1.0 * d),
        KVFormat("fp8_e5m2", "FP8 E5M2, per-tensor scale 1.0", lambda x: _kernels().fake_quant_fp8(x, "e5m2", 1.0), lambda d: 1.0 * d),
        # SGLang stores with a bare torch cast, which overflows into E5M2's infinity instead of saturating
        KVFormat("fp8_e5m2-nosat", "FP8 E5M2 as torch's cast: nearest even, +-inf from +-61440 (no saturation)",
                 lambda x: _kernels().fake_quant_fp8_torch_cast(x, "e5m2"), lambda d: 1.0 * d),
        KVFormat("int8", "INT8 symmetric per token and head", _affine(8, True), lambda d: d + 2.0),
        KVFormat("int4", "INT4 asymmetric per token and head", _affine(4, False), lambda d: d / 2 + 4.0),
        KVFormat("int2", "INT2 asymmetric per token and head", _affine(2, False), lambda d: d / 4 + 4.0),
        KVFormat("int8_pth", "vLLM int8_per_token_head (0.24+): fp32 scale max(absmax/127, 1e-6), codes rounded half away from zero",
                 _vllm_pth("int8"), lambda d: d + 4.0),
        KVFormat("int8_pth-trunc", "vLLM 0.20-0.23 int8_per_token_head: int8_pth's scale, codes truncated toward zero",
                 _vllm_pth("int8_trunc"), lambda d: d + 4.0),
        KVFormat("int8_pth-round", "int8_pth's scale with codes rounded half to even (not vLLM: differs on exact ties only)",
                 _vllm_pth("int8_round"), lambda d: d + 4.0),
        KVFormat("fp8_pth", "vLLM fp8_per_token_head: E4M3 with fp32 scale max(absmax/448, 1e-6)", _vllm_pth("fp8"), lambda d: d + 4.0),
        KVFormat("int4_pth", "vLLM int4_per_token_head: randomized Hadamard, asymmetric INT4, fp32 scale + zero point", _vllm_int4,
                 vllm_int4_bytes_per_vector),
        *(_ggml(t) for t in GGML_TYPES),
        KVFormat("q8_0-x86", "llama.cpp q8_0 as x86 AVX/AVX2 writes it: id = 127/max, ties to even (34 bytes per 32)",
                 lambda x: _q8_0_x86(x).to(x.dtype), lambda d: d / 32 * 34, 32),
        KVFormat("fp4_e2m1", "SGLang FP4: E2M1, UE8M0 scale per 16", _sglang_fp4, lambda d: d / 2 + d / 16, 16),
        # NVFP4: nibbles + one E4M3 byte per 16; the fp32 k_scale/v_scale per layer is not per token
        KVFormat("nvfp4", "vLLM nvfp4: E2M1 (ties to even), E4M3 scale per 16, k_scale 1.0", _nvfp4(1.0), nvfp4_kv_bytes_per_vector, NVFP4_KV_BLOCK),
        KVFormat("nvfp4_4over6", "vLLM nvfp4_4over6: nvfp4 with max/6 or max/4 block scales, whichever reconstructs better",
                 _nvfp4(1.0, four_over_six=True), nvfp4_kv_bytes_per_vector, NVFP4_KV_BLOCK),
        # SGLang <= 0.5.20's NVFP4 method multiplies k_scale/v_scale by 6 on SM100; its decode reads the codes exactly
        KVFormat("nvfp4-sm100", "SGLang <= 0.5.20 nvfp4 on SM100 without checkpoint scales: nvfp4 with k_scale x6 = 6.0, read exactly (decode)",
                 _nvfp4(6.0), nvfp4_kv_bytes_per_vector, NVFP4_KV_BLOCK),
        KVFormat("nvfp4-fp8read", "SGLang fp4_e2m1 recipe nvfp4 (SM120, k_scale 1.0), extend over a cached prefix: nvfp4 read back "
                 "via bf16 into FP8 E4M3", _nvfp4(1.0, fp8_read=True), nvfp4_kv_bytes_per_vector, NVFP4_KV_BLOCK),
        KVFormat("nvfp4-fp8read-sm100", "SGLang fp4_e2m1 recipe nvfp4 on SM100 (k_scale x6 = 6.0), extend over a cached prefix: "
                 "read via bf16 into FP8 E4M3", _nvfp4(6.0, fp8_read=True), nvfp4_kv_bytes_per_vector, NVFP4_KV_BLOCK),
    )
}
# SGLang's FP4 recipes: older main's --fp4-kv-cache-recipe with --kv-cache-dtype fp4_e2m1 (sgl-project/sglang@1c5f9e23
# kv_cache_quant_method.py KV_CACHE_QUANT_REGISTRY {nvfp4: NVFP4Method, mxfp4: MXFP4Method}; blockfp4 is the older
# name of the MXFP4Method kernel, kvfp4_tensor.py @0dae407b BlockFP4KVQuantizeUtil): the format a decoding query
# reads. nvfp4: FlashInferAttnBackend.forward_decode (flashinfer_backend.py @1c5f9e23) hands the raw FP4 codes
# and E4M3 block scales to FlashInfer, which reads code x scale exactly with k_scale on the softmax scale: vLLM's
# nvfp4. The FP8 workspace (nvfp4-fp8read) serves only an extend over a cached prefix (dequant_kv_for_extend).
# nvfp4-sm100: NVFP4Method.load_scales_from_model multiplies k_scale/v_scale by 6 on SM100 (SGLang 0.5.21 on: only a
# checkpoint's scale, so a release's kv_formats map it to nvfp4; wkvlab.engine_releases). SGLang 0.5.20 on names the
# recipes --kv-cache-dtype fp4_mx_block16 | nvfp4.
FP4_KV_RECIPES = {"mxfp4": "fp4_e2m1", "blockfp4": "fp4_e2m1", "nvfp4": "nvfp4", "nvfp4-sm100": "nvfp4-sm100"}
# "fp16" is the cache at model precision: bf16/auto name the same thing for a bf16 model (vLLM's auto)
_ALIASES = {"none": "fp16", "f16": "fp16", "auto": "fp16", "bf16": "fp16", "bfloat16": "fp16", "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3"}


def _exl3_format(bits: int, nearest: bool = False) -> KVFormat:
    grid = "nearest" if nearest else "midpoint"
    return KVFormat(f"exl3{'rn' if nearest else ''}_{bits}",
                    f"ExLlamaV3 {'0.0.x ' if nearest else ''}{bits}-bit: H32-rotated groups of 32, {grid} grid, fp16 scale",
                    lambda x: _exl3_kernel().fake_quant_exl3(x, bits, grid), lambda d: exl3_bytes_per_vector(d, bits), EXL3_GROUP)


def get_kv_format(name: str) -> KVFormat:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in KV_FORMATS:
        return KV_FORMATS[key]
    match = re.fullmatch(r"exl3(rn)?_([2-8])", key)
    if match:
        return _exl3_format(int(match.group(2)), nearest=bool(match.group(1)))
    match = re.fullmatch(r"quanto([24])", key)
    if match:
        return _quanto_format(int(match.group(1)))
    match = re.fullmatch(r"hqq(\d+)(?:-g(\d+))?", key)
    if match:
        bits, group = int(match.group(1)), int(match.group(2) or 64)
        if bits not in HQQ_BITS or group == 0:
            raise ConfigError(f"KV format {name!r}: HQQ's cache takes nbits {', '.join(map(str, HQQ_BITS))} and a positive group size")
        return _hqq_format(bits, group)
    match = re.fullmatch(r"nuq([2-4])(-c)?", key)
    if match:
        return _nuq_format(int(match.group(1)), bool(match.group(2)))
    match = re.fullmatch(r"int([2-8])-c(\d+)(?:-(sym|asym))?", key)
    if match:
        bits, group = int(match.group(1)), int(match.group(2))
        if group == 0:
            raise ConfigError(f"token group size must be positive in KV format {name!r}")
        return _per_channel_format(bits, group, match.group(3) == "sym")
    match = re.fullmatch(r"int([2-8])(?:-g(\d+))?(?:-(sym|asym))?", key)
    if match:
        bits, group = int(match.group(1)), int(match.group(2)) if match.group(2) else None
        if group == 0:
            raise ConfigError(f"group size must be positive in KV format {name!r}")
        symmetric = match.group(3) == "sym" if match.group(3) else bits == 8
        return _affine_format(bits, group, symmetric)
    raise ConfigError(f"unknown KV format {name!r}; use one of {', '.join(KV_FORMATS)}, int<b>[-g<G>][-sym|-asym], int<b>-c<G> (per channel over G tokens), hqq<b>[-g<G>] (HQQ, b = 1, 2, 3, 4, 8), quanto<b> (optimum-quanto, b = 2, 4) or exl3_<b> / exl3rn_<b> (ExLlamaV3 / its 0.0.x grid, b = 2..8)")
