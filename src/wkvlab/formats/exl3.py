"""ExLlamaV3's quantized KV cache: Hadamard-rotated groups of 32 on a midpoint grid.

Read in turboderp-org/exllamav3 @4f8ad0121f483ba66a5336244a4c3b6d7210385e,
``exllamav3/exllamav3_ext/cache/q_cache_kernels.cuh`` (``quant_block_x4`` / ``dequant_block_x4``)
and ``exllamav3/cache/quant.py`` (``CacheLayer_quant``). Per group of 32 consecutive values of a
token (groups never cross heads: head_dim is a multiple of 32):

1. ``y = H32 · x / sqrt(32)`` — Sylvester Hadamard (an in-register H4 times a 3-round shuffle H8,
   the same matrix), orthonormal;
2. ``s = max|y| + 1e-10`` (float32), stored as fp16 (``__float2half_rn``); codes use the unrounded
   ``1/s``;
3. ``q = clamp(floor(y/s · m + m), 0, 2^b − 1)`` with ``m = 2^(b−1)`` (``fmaf`` then
   ``__float2int_rd``) — a midpoint grid: the 2^b levels sit at ``(q − m + 0.5) / m`` of the scale,
   symmetric, without zero ("~5% lower MSE than the rounding grid");
4. dequantized ``ŷ = (q − m + 0.5) · fp16(s) / m`` and rotated back by the same H32.

ExLlamaV3 0.0.x (tags v0.0.1 to v0.0.43; read at v0.0.28 @ea87af6ea8e8a8ec00164afd1aa19d996611defe,
the same file, ``quant_block`` / ``dequant_block``) rounds onto the integer grid instead
(``grid="nearest"``, the formats ``exl3rn_<b>``): ``v /= s; v *= mf; int q = lrintf(v) + m`` clamped to
``[0, 2^b − 1]`` — round half to even, levels at ``(q − m) / m`` of the scale (zero is one; the top level
``+1`` is clipped to ``(m − 1)/m``) — dequantized ``(q − m)/m · fp16(s)`` (``mbit`` halving from ``-1/sqrt(32)``)
and rotated back. v1.0.0 replaced it with the midpoint grid.

Storage: ``b`` uint32 words (b bits per value) plus one fp16 scale per group, i.e.
``(b + 0.5) / 8`` bytes per value (``CacheLayer_quant.storage_size``). The cubic compander
(``compand_a > 0``, off by default) is not simulated. ExLlamaV3 computes in fp16 and writes fp16;
here the arithmetic is float32 and the rotation is one matrix product instead of butterflies, so
values agree to float rounding, not bit for bit.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor
from wkvlab.formats.hadamard import rotate

from wkvlab.formats.sizes import EXL3_GROUP, exl3_bytes_per_vector  # noqa: F401 - sizes live torch-free


GRIDS = ("midpoint", "nearest")


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
    work = torch.promote_types(x.dtype, torch.float32)  # float32 (the kernel's); a float64 tensor stays float64
    y = rotate(x.to(work), EXL3_GROUP)
    groups = y.reshape(*y.shape[:-1], -1, EXL3_GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True) + 1e-10
    m = float(1 << (bits - 1))
    stored = scale.to(torch.float16).to(work)
    if grid == "nearest":  # v0.0.x: v /= s (a division, not a reciprocal), v *= m, lrintf: half to even
        q = (torch.round((groups / scale) * m) + m).clamp_(0, (1 << bits) - 1)
        values = (q - m) * (stored / m)
    else:
        q = torch.floor((groups * (1.0 / scale)) * m + m).clamp_(0, (1 << bits) - 1)
        values = (q - (m - 0.5)) * (stored / m)
    return rotate(values.reshape(y.shape), EXL3_GROUP, inverse=True).to(x.dtype)


