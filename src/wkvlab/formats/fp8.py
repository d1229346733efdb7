"""FP8 (OCP E4M3 "fn" and E5M2) fake quantization with an optional scale.

The formats are torch's own ``float8_e4m3fn`` (4 exponent bits, no infinities, max 448) and
``float8_e5m2`` (IEEE-like, max finite 57344). Rounding to the 8-bit grid is done by torch's cast
(round-to-nearest-even), so results match what ``x.to(torch.float8_*)`` produces in inference
engines that use these dtypes.

Overflow is the part torch does not make uniform: casting a value beyond the finite range gives
±inf for e5m2, and for e4m3fn (which has no inf encoding) NaN in some torch releases/devices and
saturation in others (torch 2.13 on CPU saturates). Real FP8 kernels saturate, so we clamp to
±max *before* the cast; a value of 1e6 becomes 448 (e4m3) or 57344 (e5m2), never NaN or inf, on
every torch version and device. NaN inputs stay NaN (clamp propagates NaN and both formats encode it): a NaN in the
activations is a bug upstream that should stay visible.

An engine that stores its cache with a plain ``x.to(torch.float8_*)`` (SGLang's ``set_kv_buffer``) gets torch's
own overflow instead: :func:`fake_quant_fp8_torch_cast` reproduces torch 2.13's float32 → FP8 conversion
(``torch/headeronly/util/Float8_e4m3fn.h`` ``fp8e4m3fn_from_fp32_value``, ``Float8_e5m2.h``
``fp8e5m2_from_fp32_value``, the one C10_HOST_DEVICE function behind the CPU and CUDA casts): E4M3 "fn"
saturates at ±448 (its finite overflow branch returns 0x7e), E5M2 rounds to nearest even *into* its infinity,
so ±61440 (the midpoint between 57344 and the would-be 65536) and beyond become ±inf.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor, const_like

FP8Format = Literal["e4m3", "e5m2"]

FP8_FORMATS: tuple[str, ...] = get_args(FP8Format)

_DTYPES: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

__all__ = ["FP8Format", "fp8_dtype", "fp8_max", "fake_quant_fp8", "fake_quant_fp8_torch_cast", "fp8_absmax_scale"]

# torch 2.13 fp8e5m2_from_fp32_value: |x| >= 65536 returns 0x7C (inf), and nearest-even rounding carries
# [61440, 65536) into the same code (57344 has the odd mantissa 11), so overflow starts at the midpoint
E5M2_INF_FROM = 61440.0


def fp8_dtype(fmt: FP8Format) -> torch.dtype:
    """The torch dtype for ``fmt``: ``e4m3`` → ``float8_e4m3fn``, ``e5m2`` → ``float8_e5m2``."""
    try:
        return _DTYPES[fmt]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown FP8 format {fmt!r}; use one of {', '.join(FP8_FORMATS)}") from None


def fp8_max(fmt: FP8Format) -> float:
    """Largest finite value: 448.0 for e4m3 (fn variant), 57344.0 for e5m2 (from ``torch.finfo``)."""
    return float(torch.finfo(fp8_dtype(fmt)).max)


def fake_quant_fp8(x: Tensor, fmt: FP8Format, scale: Tensor | float = 1.0) -> Tensor:
    """Round ``x / scale`` to FP8 (saturating at ±max) and multiply back; same shape and dtype.

    ``scale`` is a positive float or a tensor broadcastable against ``x`` (e.g. from
    :func:`fp8_absmax_scale`); it stays in float32 as in per-tensor/per-channel scaled FP8 GEMMs.
    Computed in float32: ``cast(clamp(x / scale, ±max)) * scale``.
    """
    check_float_tensor(x)
    dtype = fp8_dtype(fmt)
    fmax = fp8_max(fmt)
    if isinstance(scale, Tensor):
        s = scale.to(device=x.device, dtype=torch.float32)
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ConfigError(f"fp8 scale must be a positive number or a tensor, got {scale!r}")
        s = const_like(x, float(scale))
    y = (x.float() / s).clamp(-fmax, fmax)
    return (y.to(dtype).float() * s).to(x.dtype)


def fake_quant_fp8_torch_cast(x: Tensor, fmt: FP8Format) -> Tensor:
    """``x.to(torch.float8_*)`` back in ``x``'s dtype, overflow included, as torch 2.13 casts (module docstring).

    E4M3 equals :func:`fake_quant_fp8` at scale 1 (torch saturates too); E5M2 differs only from ±61440 on,
    where torch's cast gives ±inf and :func:`fake_quant_fp8` ±57344. Computed explicitly rather than by
    casting, so the result does not depend on the torch build this runs under.
    """
    y = fake_quant_fp8(x, fmt, 1.0)
    if fmt == "e4m3":
        return y
    overflow = x.float().abs() >= E5M2_INF_FROM
    return torch.where(overflow, torch.sign(x) * float("inf"), y)


def fp8_absmax_scale(
    x: Tensor,
    fmt: FP8Format,
    *,
    dim: int | tuple[int, ...] | None = None,
    keepdim: bool = True,
) -> Tensor:
    """Float32 scale ``amax / fp8_max(fmt)`` over ``dim`` (``None``: the whole tensor).

    This maps the largest magnitude onto the largest finite FP8 value, the usual "delayed/
    dynamic absmax" recipe. Groups whose amax is 0 get scale 1.0 (any positive value reproduces
    zeros exactly, and 1.0 avoids 0/0). With ``keepdim`` the result broadcasts against ``x``
    (per tensor: shape ``[1] * x.ndim``).
    """
    check_float_tensor(x)
    fmax = fp8_max(fmt)
    a = x.float().abs()
    if dim is None:
        amax = a.amax()
        if keepdim:
            amax = amax.reshape((1,) * x.ndim)
    else:
        amax = a.amax(dim=dim, keepdim=keepdim)
    scale = amax / const_like(x, fmax)
    return torch.where(scale == 0, torch.ones_like(scale), scale)
