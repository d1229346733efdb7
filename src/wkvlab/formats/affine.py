"""Integer affine quantization (2..8 bits) with per-group, per-row or per-tensor scales.

Layout
------
Groups are ``group_size`` contiguous elements along the LAST dimension (``group_size=None``: the
whole last dimension, i.e. one group per row), or the whole tensor with ``per_tensor=True``.
Callers choose per-channel vs per-token by transposing/reshaping so that the elements that share
a scale are last. Internally ``x`` of shape ``[..., D]`` is viewed as ``[..., n_groups, G]``, and
:func:`affine_qparams` returns ``scale`` and ``zero`` of shape ``[..., n_groups, 1]`` (per tensor:
``[1, ..., 1]`` with ``x.ndim + 1`` ones), broadcastable against that view.

Conventions (``L = 2**bits - 1``)
--------------------------------
* symmetric: ``qmin = -2**(bits-1)``, ``qmax = 2**(bits-1) - 1``, ``scale = amax / qmax``,
  ``zero = 0``, ``x ≈ q * scale``.
* asymmetric, ``zero_point="int"`` (AWQ/GPTQ/inference-engine convention): codes in ``[0, L]``,
  integer zero point ``zp = clamp(round(-min / scale), 0, L)``, ``x ≈ (q - zp) * scale``. The
  range is widened to include 0 (``min <= 0 <= max``, as GPTQ does): an integer zero point in
  ``[0, L]`` can only describe grids that contain 0, and without the widening a group of all-
  positive values (a K channel with an offset) would be clamped to a few codes.
* asymmetric, ``zero_point="float"`` (llama.cpp Q4_1/Q5_1, KIVI): the float minimum is the
  offset, ``zero = min``, codes in ``[0, L]``, ``x ≈ q * scale + min``.

Scales are float32 computed from float32 data; storage cost of fp16 scales is accounted in
:func:`bytes_per_element_affine`, not simulated.

Numerics
--------
* Groups whose scale is 0 (all-zero groups; constant groups in float-min mode) divide by 1
  instead, so codes are 0 and the group comes back exactly (zeros, or exactly the constant).
  No NaN/Inf is produced for finite inputs whose group range fits in float32. A NaN in the input
  makes its whole group NaN (loud rather than silently clipped).
* Reconstruction is ``q * scale + min`` as two float32 operations (no fused multiply-add), the
  same expression gguf/ggml dequantize Q4_1 with (``d * q + m``). Together with the correctly
  rounded division ``(max - min) / L`` this makes float-min fake quantization reproduce an
  already-Q4_1-quantized tensor exactly: on such a group ``max = 15*d + m`` is exact (``d`` has
  11 significant bits, so ``15*d`` has at most 15), hence ``max - min = 15*d`` and
  ``/ 15`` gives back ``d`` bit for bit; codes are recovered by rounding and ``q * d + m``
  repeats gguf's arithmetic. This holds whenever every grid point ``q*d + m`` is representable
  in float32, which is the case for ``|m| < 4096 * d`` — every block except ones whose spread is
  under ~0.4% of their offset. Beyond that, the dequantized ``max`` is itself rounded and no
  scale computed from min and max alone can recover ``d``.
* Idempotence: symmetric (and one-signed int-zp groups) are exactly idempotent because
  ``fl(fl(k * fl(a / k)) / k) == fl(a / k)`` for every float32 ``a`` and ``k = 1..255`` (checked
  exhaustively over a binade). Asymmetric groups re-quantize to the same codes, but the scale
  recomputed from the dequantized extremes can move by one ulp, because those extremes
  (``(L - zp) * scale``, ``L * scale + min``) are themselves rounded; values then move by about
  one ulp of the group's range (in ~0.5% of float-min and ~10% of int-zp groups of random data).
  Dequantized Q4_1/Q5_1 data (fp16 scale and min) is an exact fixed point, as above.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_bits, check_float_tensor, check_group_size, const_like
from wkvlab.formats.rounding import Rounding, check_rounding, round_with

ZeroPoint = Literal["int", "float"]

ZERO_POINTS: tuple[str, ...] = get_args(ZeroPoint)

__all__ = [
    "ZeroPoint",
    "affine_qparams",
    "affine_quantize",
    "affine_dequantize",
    "fake_quant_affine",
    "bytes_per_element_affine",
]


def _check_zero_point(zero_point: object) -> None:
    if zero_point not in ZERO_POINTS:
        raise ConfigError(f"zero_point must be one of {', '.join(ZERO_POINTS)}, got {zero_point!r}")


def _grouped(x: Tensor, group_size: int | None, per_tensor: bool) -> Tensor:
    """View ``x`` (``[..., D]``) as ``[..., n_groups, G]``; per tensor: ``[..., 1, D]``."""
    dim = x.shape[-1]
    if per_tensor:
        if group_size is not None:
            raise ConfigError("per_tensor=True and group_size are exclusive; pass only one of them")
        return x.reshape(*x.shape[:-1], 1, dim)
    g = check_group_size(group_size, dim)
    return x.reshape(*x.shape[:-1], dim // g, g)


def _minmax(xg: Tensor, per_tensor: bool) -> tuple[Tensor, Tensor]:
    if not per_tensor:
        mn, mx = torch.aminmax(xg, dim=-1, keepdim=True)
        return mn, mx
    ones = (1,) * xg.ndim
    if xg.numel() == 0:
        z = xg.new_zeros(ones)
        return z, z
    mn, mx = torch.aminmax(xg)
    return mn.reshape(ones), mx.reshape(ones)


def _qparams_grouped(
    xg: Tensor, bits: int, symmetric: bool, zero_point: str, per_tensor: bool
) -> tuple[Tensor, Tensor]:
    """(scale, zero) for a float32 grouped view; see the module docstring for conventions."""
    mn, mx = _minmax(xg, per_tensor)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = torch.maximum(mx, -mn)
        scale = amax / const_like(xg, qmax)
        return scale, torch.zeros_like(scale)
    levels = 2**bits - 1
    if zero_point == "float":
        return (mx - mn) / const_like(xg, levels), mn
    mn = mn.clamp(max=0.0)
    mx = mx.clamp(min=0.0)
    scale = (mx - mn) / const_like(xg, levels)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    zp = torch.round(-mn / safe).clamp_(0, levels)
    return scale, zp


def _codes_grouped(
    xg: Tensor, scale: Tensor, zero: Tensor, bits: int, symmetric: bool, zero_point: str, rounding: Rounding
) -> Tensor:
    """Float32 integer-valued codes for a float32 grouped view."""
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    if symmetric:
        half = 2 ** (bits - 1)
        return round_with(xg / safe, rounding).clamp_(-half, half - 1)
    levels = 2**bits - 1
    if zero_point == "float":
        return round_with((xg - zero) / safe, rounding).clamp_(0, levels)
    return (round_with(xg / safe, rounding) + zero).clamp_(0, levels)


def _dequant_grouped(qg: Tensor, scale: Tensor, zero: Tensor, symmetric: bool, zero_point: str) -> Tensor:
    if symmetric:
        return qg * scale
    if zero_point == "float":
        # Two roundings, like gguf's `(d * qs) + m`: do not fuse into addcmul/FMA.
        return (qg * scale) + zero
    return (qg - zero) * scale


def affine_qparams(
    x: Tensor,
    bits: int,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    zero_point: ZeroPoint = "int",
    per_tensor: bool = False,
) -> tuple[Tensor, Tensor]:
    """Scale and zero for ``x``: float32 tensors of shape ``[..., n_groups, 1]``.

    The shape broadcasts against ``x.reshape(*x.shape[:-1], n_groups, G)``; with
    ``per_tensor=True`` both are ``[1] * (x.ndim + 1)``. ``zero`` is 0 for symmetric, the integer
    zero point (as integer-valued float32) for ``zero_point="int"`` and the group minimum for
    ``zero_point="float"``. ``zero_point`` is ignored when ``symmetric``.
    """
    check_float_tensor(x)
    check_bits(bits)
    _check_zero_point(zero_point)
    xg = _grouped(x.float(), group_size, per_tensor)
    return _qparams_grouped(xg, bits, symmetric, zero_point, per_tensor)


def affine_quantize(
    x: Tensor,
    scale: Tensor,
    zero: Tensor,
    bits: int,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    zero_point: ZeroPoint = "int",
    per_tensor: bool = False,
    rounding: Rounding = "half_even",
) -> Tensor:
    """Integer codes (int32, same shape as ``x``) for the given :func:`affine_qparams`.

    Symmetric codes lie in ``[-2**(bits-1), 2**(bits-1) - 1]``, asymmetric ones in
    ``[0, 2**bits - 1]``. Values are divided by the scale (true division, not multiplication by a
    reciprocal), rounded with ``rounding`` and clamped.
    """
    check_float_tensor(x)
    check_bits(bits)
    _check_zero_point(zero_point)
    check_rounding(rounding)
    xg = _grouped(x.float(), group_size, per_tensor)
    q = _codes_grouped(xg, scale.float(), zero.float(), bits, symmetric, zero_point, rounding)
    return q.reshape(x.shape).to(torch.int32)


def affine_dequantize(
    q: Tensor,
    scale: Tensor,
    zero: Tensor,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    zero_point: ZeroPoint = "int",
    per_tensor: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Values for integer codes ``q``: ``q*scale``, ``(q - zp)*scale`` or ``q*scale + min``.

    Computed in float32 and cast to ``dtype`` at the end, so the result equals
    :func:`fake_quant_affine` for the same parameters.
    """
    if not isinstance(q, Tensor) or q.ndim == 0:
        raise ConfigError("q must be a tensor of codes with at least one dimension")
    _check_zero_point(zero_point)
    qg = _grouped(q.float(), group_size, per_tensor)
    y = _dequant_grouped(qg, scale.float(), zero.float(), symmetric, zero_point)
    return y.reshape(q.shape).to(dtype)


def fake_quant_affine(
    x: Tensor,
    bits: int,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    zero_point: ZeroPoint = "int",
    per_tensor: bool = False,
    rounding: Rounding = "half_even",
) -> Tensor:
    """Quantize then dequantize ``x``; same shape and dtype as ``x``, computed in float32.

    This is the per-layer K/V hot path: a handful of vectorized elementwise ops plus one min/max
    reduction per group, no integer round trip, no Python loops. The result equals
    ``affine_dequantize(affine_quantize(x, *affine_qparams(x, ...)), ...)``.
    """
    check_float_tensor(x)
    check_bits(bits)
    _check_zero_point(zero_point)
    check_rounding(rounding)
    xg = _grouped(x.float(), group_size, per_tensor)
    scale, zero = _qparams_grouped(xg, bits, symmetric, zero_point, per_tensor)
    q = _codes_grouped(xg, scale, zero, bits, symmetric, zero_point, rounding)
    y = _dequant_grouped(q, scale, zero, symmetric, zero_point)
    return y.reshape(x.shape).to(x.dtype)


def bytes_per_element_affine(
    bits: int,
    group_size: int,
    symmetric: bool,
    zero_point: ZeroPoint,
    scale_bytes: int = 2,
) -> float:
    """Storage cost per element: packed codes plus per-group metadata.

    ``bits / 8`` for the codes, ``scale_bytes`` (fp16 by default) per group for the scale and,
    when asymmetric, an integer zero point packed at ``bits`` bits per group or a float minimum
    stored like the scale (``scale_bytes``). E.g. 4-bit, group 32, float min: 0.5 + 2/32 + 2/32
    = 0.625 bytes = 5 bits, exactly llama.cpp's Q4_1 (20 bytes per 32 values).
    """
    check_bits(bits)
    _check_zero_point(zero_point)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ConfigError(
            f"group_size must be a positive integer (the row length for per-row scales), got {group_size!r}"
        )
    if isinstance(scale_bytes, bool) or not isinstance(scale_bytes, int) or scale_bytes <= 0:
        raise ConfigError(f"scale_bytes must be a positive integer (2 for fp16 scales), got {scale_bytes!r}")
    per_group = float(scale_bytes)
    if not symmetric:
        per_group += bits / 8 if zero_point == "int" else scale_bytes
    return bits / 8 + per_group / group_size
