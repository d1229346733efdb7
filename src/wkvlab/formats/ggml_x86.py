"""llama.cpp's x86 (AVX/AVX2) q8_0 writer, beside the reference quantizer of :mod:`.ggml`.

ggml-cpu's ``from_float`` for q8_0 — what writes a q8_0 KV cache (``ggml_set_rows``) and converts
Q to K's ``vec_dot_type`` in the CPU flash attention — is ``quantize_row_q8_0`` in
``ggml/src/ggml-cpu/arch/x86/quants.c`` on x86 builds with AVX or AVX2 (ggml-org/llama.cpp
@04e1dd75ab73c5c1814474138d8b18e9613f3d80), not ``quantize_row_q8_0_ref`` (``ggml-quants.c``,
which ``gguf.quants`` ports). Per block of 32, in float32::

    d  = maxScalar / 127.f;            y.d = fp16(d)
    id = maxScalar != 0 ? 127.f / maxScalar : 0      # the reference uses 1/d
    q  = _mm256_round_ps(x * id, _MM_ROUND_NEAREST)   # half to EVEN; the reference's roundf is half away
    (packs_epi32 / packs_epi16 saturate to int8)

Two differences, then: ``127/max`` and ``1/(max/127)`` can differ in the last bit, moving a code
whose product lands within an ulp of a half; and exact ties go to the even code. The stored scale
is the same. Only q8_0 has an x86-specific writer among the cache types (q4_0 … iq4_nl use the
reference code on every CPU); q8_1 (Q for q4_1/q5_1 keys) has its own, not modelled here.

A block whose max is below ~3.7e-37 overflows ``id`` to inf: ``_mm256_cvtps_epi32`` turns ±inf/NaN
into 0x80000000, which the two ``packs`` saturate to -128, times the fp16 scale 0: every value is -0.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.formats._checks import check_float_tensor, const_like
from wkvlab.formats.ggml import stored_codes
from wkvlab.formats.sizes import QK


def fake_quant_q8_0_x86(x: Tensor) -> Tensor:
    """Float32 values of ``x`` (last dim a multiple of 32) as the x86 AVX/AVX2 q8_0 writer stores them."""
    check_float_tensor(x)
    if x.shape[-1] % QK:
        from wkvlab.errors import ConfigError

        raise ConfigError(f"q8_0 quantizes blocks of {QK}; the last dimension {x.shape[-1]} is not a multiple of {QK}")
    b = x.float().reshape(-1, QK)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d16 = (amax / const_like(b, 127.0)).to(torch.float16).float()
    inv = torch.where(amax == 0, torch.zeros_like(amax), const_like(b, 127.0) / amax)
    q = stored_codes(torch.round(b * inv), -128.0).clamp_(-128, 127)
    return (q * d16).reshape(x.shape)
