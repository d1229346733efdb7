"""FP4 (E2M1) block formats: NVIDIA's NVFP4 and the OCP Microscaling MXFP4, as pure functions.

E2M1 holds ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (OCP Microscaling Formats spec v1.0, table 5). Both
formats share a scale per block of consecutive values along the last dimension:

* **NVFP4** — blocks of 16, the block scale stored as FP8 E4M3, and an fp32 per-tensor scale so
  the block scales use E4M3's range: ``global = amax(tensor) / (6 · 448)``; block scale
  ``e4m3(amax(block) / 6 / global)``; value ``e2m1(x / (block · global))``. This is how NVIDIA
  TensorRT Model Optimizer computes ``weight_scale_2`` and ``weight_scale`` for NVFP4 checkpoints
  (``NVFP4QTensor.get_weights_scaling_factor``).
* **MXFP4** — blocks of 32, the scale a power of two stored as E8M0:
  ``2**(floor(log2(amax(block))) − 2)`` (``emax`` of E2M1 is 2), values above 6 after scaling
  saturate to 6. This is the OCP spec's conversion (section 6.3); some kernels round the scale up
  instead to avoid the saturation, which the spec does not prescribe.

Rounding to E2M1 is round-to-nearest, ties to the even mantissa, as NVIDIA's ``cvt.rn`` does.
Storage: 4 bits per value plus one byte per block (NVFP4 adds 4 bytes per tensor).
"""
from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor, const_like
from wkvlab.formats.fp8 import fake_quant_fp8

from wkvlab.formats.sizes import FP4_BLOCK, FP4Format, fp4_bytes  # torch-free byte counts

FP4_FORMATS: tuple[str, ...] = get_args(FP4Format)
E2M1_MAX = 6.0
_E4M3_MAX = 448.0

__all__ = ["FP4Format", "FP4_BLOCK", "E2M1_MAX", "round_e2m1", "nvfp4_global_scale", "fake_quant_fp4", "fp4_bytes"]


def round_e2m1(x: Tensor) -> Tensor:
    """Nearest E2M1 value (ties to even mantissa), saturating at ±6; same shape and dtype.

    The grid's spacing is 0.5 below 2, 1 below 4 and 2 up to 6; within each range the grid index
    is ``|x| / spacing``, whose even integers are exactly the even mantissas, so
    ``torch.round`` (half to even) implements the hardware tie rule.
    """
    a = x.float().abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    q = (torch.round(a / step) * step).clamp_(max=E2M1_MAX)
    return (torch.sign(x.float()) * q).to(x.dtype)


def _blocks(x: Tensor, block: int) -> Tensor:
    dim = x.shape[-1]
    if dim % block:
        raise ConfigError(f"FP4 blocks of {block} need a last dimension divisible by {block}, got {dim}; pad the tensor or use an integer format")
    return x.float().reshape(*x.shape[:-1], dim // block, block)


def nvfp4_global_scale(amax: Tensor | float) -> Tensor:
    """fp32 per-tensor scale ``amax / (6 · 448)`` (1.0 for an all-zero tensor)."""
    a = torch.as_tensor(amax, dtype=torch.float32)
    scale = a / (E2M1_MAX * _E4M3_MAX)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def fake_quant_fp4(x: Tensor, fmt: FP4Format, global_scale: Tensor | float | None = None) -> Tensor:
    """Quantize ``x`` to ``fmt`` in blocks along the last dimension and back; same shape and dtype.

    ``global_scale`` (NVFP4 only) is the per-tensor scale; ``None`` computes it from ``x`` itself
    (what weights use; activations pass a calibrated one, as ``input_scale`` in checkpoints). A
    Python number is filled on ``x``'s device: an activation hook runs per linear per forward, and
    a CPU scalar tensor moved there would be a host-to-device copy (a synchronization) each time.
    """
    check_float_tensor(x)
    if fmt not in FP4_FORMATS:
        raise ConfigError(f"unknown FP4 format {fmt!r}; use one of {', '.join(FP4_FORMATS)}")
    xb = _blocks(x, FP4_BLOCK[fmt])
    amax = xb.abs().amax(dim=-1, keepdim=True)
    if fmt == "nvfp4":
        if global_scale is None:
            g = nvfp4_global_scale(xb.abs().amax())
        elif isinstance(global_scale, Tensor):
            g = global_scale.float().to(x.device)
        else:
            g = torch.full((), global_scale, dtype=torch.float32, device=x.device)
        block = fake_quant_fp8(amax / const_like(x, E2M1_MAX) / g, "e4m3") * g
    else:
        # E8M0: 2**(floor(log2 amax) - 2), exponent range of E8M0 is 2**-127 .. 2**127.
        exp = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2
        block = torch.exp2(exp.clamp(-127, 127))
    safe = torch.where(block > 0, block, torch.ones_like(block))
    y = round_e2m1(xb / safe) * safe
    return y.reshape(x.shape).to(x.dtype)


