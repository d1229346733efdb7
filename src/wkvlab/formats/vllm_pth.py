"""vLLM's ``int8_per_token_head`` and ``fp8_per_token_head`` KV caches, store step included.

Read in vllm-project/vllm, ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``
(``_reshape_cache_per_token_head``; the per-token kernel beside it at
@027e07f2fab2722388a526a49d5353945775d256 has the same lines), per (token, KV head), in float32::

    scale = tl.maximum(tl.max(tl.abs(x)) / QUANT_MAX, 1e-6)      # stored as float32
    q     = tl.clamp(x * (1.0 / scale), QUANT_MIN, QUANT_MAX)
    tl.store(cache_ptr, q)                                       # implicit cast to the cache dtype

with ``(QUANT_MAX, QUANT_MIN) = (127, -128)`` for ``torch.int8`` and ``(448, -448)`` for
``float8_e4m3fn`` (``_PER_TOKEN_HEAD_QUANT_PARAMS``, CUDA; ROCm's fnuz range is not modelled). The
store is where the two differ: Triton lowers a float32 → int8 store to ``fptosi``, which
**truncates toward zero** — vLLM's own test says so ("INT8 Triton stores truncate; FP8 hardware
casts round", ``tests/quantization/test_per_token_kv_cache.py``
@01e4fce07423dafcc832600ba05159fb28dc1126) — while the FP8 cast rounds to nearest even. Attention
dequantizes ``q · scale``.

Re-read for issue #25 item 3 in the newest copy: the modes moved to
``vllm/v1/attention/ops/triton_quant_kv/int8_fp8_per_token_head.py`` (@f51ccb3e03634773babf356c896bb101ac5d696a;
``_per_token_head_kernel.py`` @8940d7db4a47a9d9700bad90f1142130f699950c has the same kernel) with the
same lines — ``scale = tl.maximum(tl.max(tl.abs(k_h)) / QUANT_MAX, 1e-6)``,
``tl.clamp(k_h * (1.0 / k_scale), QUANT_MIN, QUANT_MAX)`` stored through the cache pointer — and the
FP8 range from ``get_fp8_min_max()``. That module's docstring writes ``q = clamp(round(x / scale), ...)``;
the code has no rounding call, so the int8 store still truncates.

Truncation keeps every code's magnitude at or below ``|x| / scale``: its error is ~4× the rounding
MSE and biased toward zero, which is why the faithful format truncates and ``int8_pth-round`` (the
same scale, rounded half to even) exists only to measure what the truncation costs.

Not modelled: Triton's float32 division is ``div.full.f32`` (within 2 ulp of IEEE), here it is
IEEE; a code can differ when ``x / scale`` lands within an ulp of an integer.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor

PTHKind = Literal["int8", "int8_round", "fp8"]
_RANGES = {"int8": (127.0, -128.0), "int8_round": (127.0, -128.0), "fp8": (448.0, -448.0)}
SCALE_FLOOR = 1e-6  # tl.maximum(absmax / QUANT_MAX, 1e-6)


def pth_scale(x: Tensor, kind: PTHKind) -> Tensor:
    """The float32 scale per vector (last dim kept): ``max(absmax / QUANT_MAX, 1e-6)``."""
    quant_max = _RANGES[kind][0]
    return torch.clamp(x.float().abs().amax(dim=-1, keepdim=True) / quant_max, min=SCALE_FLOOR)


def quantize_vllm_per_token_head(x: Tensor, kind: PTHKind = "int8") -> tuple[Tensor, Tensor]:
    """The stored codes (int8 or float8_e4m3fn) and float32 scales of ``x`` (``[..., head_dim]``)."""
    check_float_tensor(x)
    if kind not in _RANGES:
        raise ConfigError(f"unknown vLLM per-token-head kind {kind!r}; use one of {', '.join(_RANGES)}")
    quant_max, quant_min = _RANGES[kind]
    scale = pth_scale(x, kind)
    q = torch.clamp(x.float() * (1.0 / scale), quant_min, quant_max)
    if kind == "int8":
        return torch.trunc(q).to(torch.int8), scale  # the store's fptosi
    if kind == "int8_round":
        return torch.round(q).to(torch.int8), scale
    return q.to(torch.float8_e4m3fn), scale  # round to nearest even; clamped first, so no overflow


def fake_quant_vllm_per_token_head(x: Tensor, kind: PTHKind = "int8") -> Tensor:
    """``x`` as the cache returns it: ``code · scale`` in ``x``'s dtype."""
    q, scale = quantize_vllm_per_token_head(x, kind)
    return (q.float() * scale).to(x.dtype)
