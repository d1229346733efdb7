"""ExLlamaV3's quantized KV cache: Hadamard-rotated groups of 32 on a midpoint grid.

Read in turboderp-org/exllamav3 @4f8ad0121f483ba66a5336244a4c3b6d7210385e,
``exllamav3/exllamav3_ext/cache/q_cache_kernels.cuh`` (``had_4_inreg``, ``had_8_subgroup``,
``quant_block_x4`` / ``dequant_block_x4``; last changed in 7858de86) and ``exllamav3/cache/quant.py``
(``CacheLayer_quant``). Per group of 32 consecutive values of a token (groups never cross heads:
head_dim is a multiple of 32), all in float32:

1. rotation: the unnormalized H32 as the kernel computes it — butterflies ``(a, b) → (a + b, a − b)``
   over index strides 1 and 2 (``had_4_inreg``: lane-local values 4l..4l+3), then 4, 8, 16
   (``had_8_subgroup``: ``__shfl_xor`` over lanes 1, 2, 4; the upper lane computes ``−own + partner``,
   the same float as ``partner − own``) — then each value times ``r32 = 0.17677669529663688110f``;
2. ``s = max|y| + 1e-10f``, stored as fp16 (``__float2half_rn``); codes use the unrounded ``1/s``;
3. ``q = clamp(floor(fmaf(y·(1/s), m, m)), 0, 2^b − 1)`` with ``m = 2^(b−1)`` — a midpoint grid: the
   2^b levels sit at ``(q − m + 0.5) / m`` of the scale, symmetric, without zero. ``y·(1/s)·m`` is
   exact (m is a power of two), so the fused and the two-step form round alike;
4. dequantized ``v = (q − (m − 0.5)) · ((fp16(s) · r32) · (1/m))``, rotated back by the same
   unnormalized butterflies (r32 is already inside the scale), written as fp16.

Butterflies, not a matrix product: on structured data (constant or integer-valued groups) many rotated
values are exact zeros, i.e. exactly on the code boundary ``floor(m)``; a matrix product leaves them
±1 ulp off and flips such codes a full step. With the butterfly order every float operation is the
kernel's, so an fp16 input (what the kernel reads: ``const half* in``) gives the kernel's fp16 output
bit for bit. A float32 input is rotated as is and the result stays float32 (the kernel would round
both ends to fp16). Storage: ``b`` uint32 words (b bits per value) plus one fp16 scale per group,
i.e. ``(b + 0.5) / 8`` bytes per value (``CacheLayer_quant.storage_size``). The cubic compander
(``compand_a > 0``, off by default) is not simulated.

ExLlamaV3 0.0.x (tags v0.0.1 to v0.0.43; read at v0.0.28 @ea87af6ea8e8a8ec00164afd1aa19d996611defe,
the same file, ``quant_block`` / ``dequant_block``) rounds onto the integer grid instead
(``grid="nearest"``, the formats ``exl3rn_<b>``): ``v /= s; v *= mf; int q = lrintf(v) + m`` clamped to
``[0, 2^b − 1]`` — round half to even, levels at ``(q − m) / m`` of the scale (zero is one; the top level
``+1`` is clipped to ``(m − 1)/m``) — dequantized ``(q − m)/m · fp16(s)`` and rotated back, here by the
same butterflies as the midpoint grid. v1.0.0 replaced it with the midpoint grid. The 0.0.x grid is
modelled to float rounding, not claimed bit for bit.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor, const_like

from wkvlab.formats.sizes import EXL3_GROUP, exl3_bytes_per_vector  # noqa: F401 - sizes live torch-free

R32 = 0.17677669529663688110  # the kernel's float constant 1/sqrt(32) (rounded to float32 where it is used)


def kernel_hadamard32(x: Tensor) -> Tensor:
    """Unnormalized H32 on groups of 32 along the last dim, in the kernel's butterfly order.

    Strides 1, 2 (``had_4_inreg``: ``s0 = v0 + v1, d0 = v0 − v1, …; v0 = s0 + s1, v1 = d0 + d1,
    v2 = s0 − s1, v3 = d0 − d1``) then 4, 8, 16 (``had_8_subgroup``): at every stage the lower index
    becomes ``lo + hi`` and the upper ``lo − hi``, each one float32 rounding, in ``x``'s dtype."""
    shape = x.shape
    y = x.reshape(-1, EXL3_GROUP)
    for stride in (1, 2, 4, 8, 16):
        pairs = y.reshape(-1, EXL3_GROUP // (2 * stride), 2, stride)
        lo, hi = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((lo + hi, lo - hi), dim=2).reshape(-1, EXL3_GROUP)
    return y.reshape(shape)


GRIDS = ("midpoint", "nearest")


def exl3_encode(x: Tensor, bits: int, grid: str = "midpoint") -> tuple[Tensor, Tensor]:
    """(float32 codes ``[..., D/32, 32]``, float32 unrounded scales ``[..., D/32, 1]``) of ``x``'s groups:
    ``grid`` "midpoint" (v1.0.0 on: ``floor(y·(1/s)·m + m)``) or "nearest" (v0.0.x: ``lrintf(y/s·m) + m``)."""
    work = torch.promote_types(x.dtype, torch.float32)  # float32 (the kernel's); a float64 tensor stays float64
    y = kernel_hadamard32(x.to(work)) * const_like(x, R32).to(work)
    groups = y.reshape(*y.shape[:-1], -1, EXL3_GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True) + const_like(x, 1e-10).to(work)
    m = const_like(x, float(1 << (bits - 1))).to(work)
    if grid == "nearest":  # v /= s (a division, not a reciprocal), v *= m, lrintf: half to even
        q = (torch.round((groups / scale) * m) + m).clamp_(0, (1 << bits) - 1)
    else:
        q = torch.floor((groups * (1.0 / scale)) * m + m).clamp_(0, (1 << bits) - 1)
    return q, scale


def fake_quant_exl3(x: Tensor, bits: int, grid: str = "midpoint") -> Tensor:
    """``x`` (``[..., D]``, D a multiple of 32) as ExLlamaV3's ``bits``-bit cache returns it: ``grid``
    "midpoint" (v1.0.0 on, ``exl3_<b>``) or "nearest" (v0.0.x, ``exl3rn_<b>``)."""
    check_float_tensor(x)
    if grid not in GRIDS:
        raise ConfigError(f"ExLlamaV3 cache grid {grid!r}: use one of {', '.join(GRIDS)}")
    if not 2 <= bits <= 8:
        raise ConfigError(f"ExLlamaV3 caches hold 2 to 8 bits, got {bits}")
    if x.shape[-1] % EXL3_GROUP:
        raise ConfigError(f"ExLlamaV3 quantizes groups of {EXL3_GROUP}; head_dim {x.shape[-1]} is not a multiple of {EXL3_GROUP}")
    q, scale = exl3_encode(x, bits, grid)
    work = q.dtype
    m = float(1 << (bits - 1))
    step = (scale.to(torch.float16).to(work) * const_like(x, R32).to(work)) * const_like(x, 1.0 / m).to(work)  # sm = s16·r32·inv_mf
    offset = m if grid == "nearest" else m - 0.5  # levels at (q − m)/m or (q − m + 0.5)/m of the scale
    values = (q - const_like(x, offset).to(work)) * step
    return kernel_hadamard32(values.reshape(x.shape)).to(x.dtype)
