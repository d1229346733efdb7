"""llama.cpp (ggml) 32-element block formats, bit-identical to ``gguf.quants``.

``gguf.quants`` is the llama.cpp project's numpy port of ``ggml-quants.c``; this module redoes the
same arithmetic in torch so that it runs vectorized (and on GPU) in the KV/weight hot path, and is
tested byte-for-byte against it. Details that matter for bit-identity:

* Scales are computed in float32 from float32 data and only then rounded to fp16 for storage;
  codes are computed with the *unrounded* float32 scale and its reciprocal ``id = 1/d`` (0 when
  ``d == 0``), exactly as the C reference does. Dequantization multiplies by the fp16 scale.
* q4_0/q5_0 (symmetric): ``d = max / -8`` (``/ -16``), where ``max`` is the signed element of
  largest magnitude (first one on ties), so that element maps to code 0 (value ``-8*d``) and the
  opposite side gets one level less. Codes ``trunc(x*id + 8.5)`` (``16.5``) clipped to 15 (31).
* q4_1/q5_1: ``d = (max - min) / 15`` (``/ 31``), ``m = min``; codes ``trunc((x - min)*id + 0.5)``;
  dequantized as ``d*q + m`` in two float32 operations.
* q8_0: ``d = amax / 127``; codes ``roundf(x*id)``, i.e. round half AWAY from zero (C ``roundf``,
  gguf's ``np_roundf``), not torch's half-to-even.
* Packing: 2-byte little-endian fp16 ``d`` (then ``m`` for the ``_1`` types), then for 5-bit types
  a 32-bit ``qh`` whose bit j is bit 4 of code j, then 16 bytes ``qs[j] = q[j] | q[j+16] << 4``
  (q8_0: 32 int8 codes).
* iq4_nl: a 16-entry non-uniform codebook with a fp16 scale found by search; see ``_iq4nl``.
* q8_K (matmul inputs of K-quant weights only, never stored in a file): blocks of 256 with a
  float32 scale, see :func:`fake_quant_q8_K`.
* Tiny blocks: when the scale is so small that ``1/d`` overflows to inf (a block max below
  ~3.7e-37 for q8_0, ~2.4e-38 for q4_0), ``x*id`` is ±inf or NaN (``0*inf``). C converts those to
  an integer with x86's "integer indefinite" 0x80000000, whose low byte is 0, and gguf-py's numpy
  ``astype`` gives 0 too; the fp16 scale of such a block is 0, so every value dequantizes to ±0.
  Here a non-finite code becomes 0 (:func:`stored_codes`) — never NaN, which would poison a whole
  softmax row — and the bytes and the sign of each zero match gguf-py's.

Divisions use device tensors as divisors (see ``_checks.const_like``): on CUDA a Python-number
divisor is turned into a multiplication by its reciprocal, which is not bit-identical.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor, const_like
from wkvlab.formats._iq4nl import iq4nl_encode, iq4nl_values
from wkvlab.formats.rounding import round_with

# block shapes and sizes live in the torch-free .sizes (byte counts are needed without torch)
from wkvlab.formats.sizes import GGML_TYPE_SIZE as _TYPE_SIZE
from wkvlab.formats.sizes import GGML_TYPES, QK, ggml_block_shape, ggml_bytes_per_element
from wkvlab.formats.sizes import check_ggml_type as _check_type

__all__ = [
    "GGML_TYPES",
    "ggml_block_shape",
    "ggml_bytes_per_element",
    "ggml_quantize",
    "ggml_dequantize",
    "fake_quant_ggml",
    "fake_quant_q8_K",
    "QK_K",
]

QK_K = 256  # values per q8_K block (ggml-common.h)


def _check_ntry(ntry: object) -> int:
    if isinstance(ntry, bool) or not isinstance(ntry, int) or not -1 <= ntry <= 64:
        raise ConfigError(f"ntry must be an integer from -1 to 64 (7: llama-quantize, -1: runtime), got {ntry!r}")
    return ntry


def _to_blocks(x: Tensor) -> Tensor:
    check_float_tensor(x)
    if x.shape[-1] % QK != 0:
        raise ConfigError(
            f"ggml block formats need the last dimension to be a multiple of {QK}, got {x.shape[-1]}; "
            "pad it or use an affine format with a group size that divides it"
        )
    return x.float().reshape(-1, QK)


def stored_codes(q: Tensor, fill: float = 0.0) -> Tensor:
    """Float codes as the integers C stores: ±inf/NaN become ``fill`` (x86's float→int conversion
    leaves 0x80000000, low byte 0, when ``1/d`` overflowed; see the module docstring), and -0.0
    becomes +0 (an int8 has no negative zero, so ``d * q`` of a small negative value is +0 in gguf)."""
    return torch.where(torch.isfinite(q), q, torch.full_like(q, fill)) + 0.0


def _encode(b: Tensor, t: str, ntry: int) -> tuple[Tensor, Tensor | None, Tensor]:
    """(fp16 scale [n,1], fp16 min [n,1] or None, float32 integer-valued codes [n,32])."""
    one = const_like(b, 1.0)
    if t == "iq4_nl":
        d, codes = iq4nl_encode(b, ntry)
        return d.to(torch.float16), None, codes.float()
    if t in ("q4_0", "q5_0"):
        half = 8 if t == "q4_0" else 16
        imax = b.abs().argmax(dim=-1, keepdim=True)
        d = b.gather(-1, imax) / const_like(b, -half)
        inv = torch.where(d == 0, torch.zeros_like(d), one / d)
        q = stored_codes(torch.trunc(b * inv + (half + 0.5))).clamp_(0, 2 * half - 1)
        return d.to(torch.float16), None, q
    if t in ("q4_1", "q5_1"):
        levels = 15 if t == "q4_1" else 31
        mn, mx = torch.aminmax(b, dim=-1, keepdim=True)
        d = (mx - mn) / const_like(b, levels)
        inv = torch.where(d == 0, torch.zeros_like(d), one / d)
        q = stored_codes(torch.trunc((b - mn) * inv + 0.5)).clamp_(0, levels)
        return d.to(torch.float16), mn.to(torch.float16), q
    # q8_0
    d = b.abs().amax(dim=-1, keepdim=True) / const_like(b, 127)
    inv = torch.where(d == 0, torch.zeros_like(d), one / d)
    q = stored_codes(round_with(b * inv, "half_away"))
    return d.to(torch.float16), None, q


def _decode(d16: Tensor, m16: Tensor | None, q: Tensor, t: str) -> Tensor:
    """Float32 values, with gguf's expressions (so products/sums round the same way)."""
    d = d16.float()
    if t == "iq4_nl":
        return d * iq4nl_values(q)
    if t == "q4_0":
        return d * (q - 8)
    if t == "q5_0":
        return d * (q - 16)
    if t in ("q4_1", "q5_1"):
        assert m16 is not None
        return (d * q) + m16.float()
    return q * d  # q8_0


def _fp16_bytes(v: Tensor) -> Tensor:
    """[n, 1] fp16 -> [n, 2] uint8, host byte order (little-endian, as gguf files)."""
    return v.reshape(-1).contiguous().view(torch.uint8).reshape(-1, 2)


def _fp16_from_bytes(b: Tensor) -> Tensor:
    """[n, 2] uint8 -> [n, 1] fp16."""
    return b.reshape(-1).contiguous().view(torch.float16).reshape(-1, 1)


def _pack(d16: Tensor, m16: Tensor | None, q: Tensor, t: str) -> Tensor:
    parts = [_fp16_bytes(d16)]
    if m16 is not None:
        parts.append(_fp16_bytes(m16))
    if t == "q8_0":
        parts.append(q.to(torch.int8).view(torch.uint8).reshape(-1, QK))
        return torch.cat(parts, dim=-1)
    qi = q.to(torch.uint8)
    if t in ("q5_0", "q5_1"):
        bits = ((qi >> 4) & 1).reshape(-1, 4, 8)
        weights = torch.pow(2, torch.arange(8, device=q.device)).to(torch.uint8)
        parts.append((bits * weights).sum(dim=-1, dtype=torch.uint8))
        qi = qi & 0x0F
    parts.append(qi[:, :16] | (qi[:, 16:] << 4))
    return torch.cat(parts, dim=-1)


def _unpack(raw: Tensor, t: str) -> tuple[Tensor, Tensor | None, Tensor]:
    d16 = _fp16_from_bytes(raw[:, 0:2])
    pos = 2
    m16 = None
    if t in ("q4_1", "q5_1"):
        m16 = _fp16_from_bytes(raw[:, 2:4])
        pos = 4
    if t == "q8_0":
        return d16, None, raw[:, pos:].reshape(-1).view(torch.int8).reshape(-1, QK).float()
    qh = None
    if t in ("q5_0", "q5_1"):
        qh = raw[:, pos : pos + 4]
        pos += 4
    qs = raw[:, pos : pos + 16]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
    if qh is not None:
        shifts = torch.arange(8, dtype=torch.uint8, device=raw.device)
        hi = ((qh.unsqueeze(-1) >> shifts) & 1).reshape(-1, QK)
        q = q | (hi << 4)
    return d16, m16, q.float()


def ggml_quantize(x: Tensor, type_name: str, *, ntry: int = 7) -> Tensor:
    """Quantize ``x`` (``[..., D]``, D a multiple of 32) to ggml block bytes.

    Returns uint8 of shape ``[..., D // 32 * bytes_per_block]``, the same bytes as
    ``gguf.quants.quantize(x.float().numpy(), T)``. ``ntry`` only affects iq4_nl: 7 is
    ``quantize_iq4_nl`` (model files), -1 the runtime ``quantize_row_iq4_nl_ref`` (KV cache).
    """
    t = _check_type(type_name)
    _check_ntry(ntry)
    b = _to_blocks(x)
    raw = _pack(*_encode(b, t, ntry), t)
    return raw.reshape(*x.shape[:-1], x.shape[-1] // QK * _TYPE_SIZE[t])


def ggml_dequantize(raw: Tensor, type_name: str) -> Tensor:
    """Float32 values of ggml block bytes (``[..., n_bytes]`` → ``[..., n_blocks * 32]``).

    Same values as ``gguf.quants.dequantize(raw.numpy(), T)``.
    """
    t = _check_type(type_name)
    if not isinstance(raw, Tensor) or raw.dtype != torch.uint8 or raw.ndim == 0:
        raise ConfigError("raw must be a uint8 tensor of ggml block bytes with at least one dimension")
    size = _TYPE_SIZE[t]
    if raw.shape[-1] % size != 0:
        raise ConfigError(f"{t} rows must be a multiple of {size} bytes, got {raw.shape[-1]}; check the type name")
    y = _decode(*_unpack(raw.reshape(-1, size), t), t)
    return y.reshape(*raw.shape[:-1], raw.shape[-1] // size * QK)


def fake_quant_ggml(x: Tensor, type_name: str, *, ntry: int = 7) -> Tensor:
    """Float32 ``dequantize(quantize(x))`` computed directly, without packing to bytes.

    Any float dtype is converted to float32 first (as gguf does); the result has ``x``'s shape
    and is bit-identical to the gguf round trip. ``ntry``: see :func:`ggml_quantize`.
    """
    t = _check_type(type_name)
    _check_ntry(ntry)
    b = _to_blocks(x)
    return _decode(*_encode(b, t, ntry), t).reshape(x.shape)


def fake_quant_q8_K(x: Tensor) -> Tensor:
    """Float32 values of ``x`` rounded to llama.cpp's q8_K blocks (the vec_dot_type of K-quants).

    Follows ``quantize_row_q8_K_ref`` in ``ggml/src/ggml-quants.c`` (llama-cpp-python 0.3.36 vendors
    ggml-org/llama.cpp@0c1e57098; the x86 ``quantize_row_q8_K`` calls the reference, and the AVX2
    repacked path ``ggml_quantize_mat_q8_K_4x8`` gives the same values): per block of 256, ``max``
    is the element of largest magnitude (the first on ties), ``iscale = -127 / max`` in float32,
    codes ``nearest_int(iscale * x)`` — round half to EVEN, ggml's magic-number trick — capped at
    127, the scale stored as the float32 ``d = 1 / iscale``; values are ``d * q``. An all-zero
    block stays zero. Unlike q8_0 there is no fp16 rounding of the scale. A block whose max is below
    ~3.7e-37 overflows ``iscale`` to inf: ``nearest_int`` of ±inf/NaN keeps only mantissa bits
    (``(i & 0x007fffff) - 0x00400000``), whose int8 store is 0, and ``d = 1/iscale`` is ±0 — so
    its values are ±0, never NaN.
    """
    check_float_tensor(x)
    if x.shape[-1] % QK_K != 0:
        raise ConfigError(f"q8_K blocks hold {QK_K} values; the last dimension {x.shape[-1]} is not a multiple of {QK_K}")
    b = x.float().reshape(-1, QK_K)
    imax = b.abs().argmax(dim=-1, keepdim=True)  # torch returns the first index on ties, like the C loop's strict '>'
    peak = b.gather(-1, imax)
    zero = peak == 0
    iscale = const_like(b, -127.0) / torch.where(zero, torch.ones_like(peak), peak)
    q = stored_codes(torch.round(iscale * b)).clamp_(-128, 127)
    d = torch.where(zero, torch.zeros_like(iscale), const_like(b, 1.0) / iscale)
    return (d * q).reshape(x.shape)
