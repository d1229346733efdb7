"""vLLM's ``int8_per_token_head`` and ``fp8_per_token_head`` KV caches, store step included.

Read in vllm-project/vllm, ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``
``_reshape_cache_per_token_head``, per (token, KV head), in float32 — as released (the PyPI sdists,
whose ``vllm/_version.py`` names the commit)::

    scale = tl.maximum(tl.max(tl.abs(x)) / QUANT_MAX, 1e-6)      # stored as float32
    q     = x * (1.0 / scale)
    if IS_INT_QUANT:                                             # vLLM >= 0.24.0 only
        q = tl.where(q >= 0, q + 0.5, q - 0.5)                   # "Round half away from zero before
    q     = tl.clamp(q, QUANT_MIN, QUANT_MAX)                    #  the int8 store truncates."
    tl.store(cache_ptr, q)                                       # implicit cast to the cache dtype

with ``(QUANT_MAX, QUANT_MIN) = (127, -128)`` for ``torch.int8`` and ``(448, -448)`` for
``float8_e4m3fn`` (CUDA; ROCm's fnuz range is not modelled). Triton lowers a float32 → int8 store to
``fptosi``, which truncates toward zero; the FP8 cast rounds to nearest even. Attention dequantizes
``q · scale``. The int8 store by release:

* ``int8`` (format ``int8_pth``) — vLLM 0.24.0 to 0.34.0 (0.34.0 = @62d4bc3c7, lines 231-234 and
  263-266; 0.24.0 = @ee0da84ab): ``+0.5`` / ``-0.5`` in float32, clamp, truncate. That is round half
  away from zero (not ``torch.round``'s half to even: 63.5 → 64, 62.5 → 63, -62.5 → -63), except
  where the float32 addition itself rounds: a ``q`` one ulp below a half step (0.49999997) becomes
  1.0 after ``+0.5`` and stores 1, where exact half-away rounding gives 0. vLLM's own test says
  "INT8 rounds explicitly" (``tests/quantization/test_per_token_kv_cache.py`` in the 0.34.0 sdist).
* ``int8_trunc`` (format ``int8_pth-trunc``) — vLLM 0.20.0 (which added ``int8_per_token_head``) to
  0.23.0 (@91df0fad4): ``tl.clamp(x * (1.0 / scale), ...)`` stored directly, so the code is
  truncated toward zero ("INT8 Triton stores truncate; FP8 hardware casts round",
  ``tests/quantization/test_per_token_kv_cache.py`` in the 0.23.0 sdist; the same line at main
  @027e07f2 and @01e4fce0). Its error is ~4× the rounding MSE and biased toward zero.
* ``int8_round`` (format ``int8_pth-round``) — the same scale rounded half to even: not an engine,
  kept to compare; it differs from ``int8`` only on exact ties.

Which release a preset models is data: ``src/wkvlab/plan/data/engines.yaml`` (``vllm:`` = the newest,
``vllm@0.23:`` the truncating store).

Not modelled: Triton's float32 division is ``div.full.f32`` (within 2 ulp of IEEE), here it is
IEEE; a code can differ when ``x / scale`` lands within an ulp of a rounding boundary.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor

PTHKind = Literal["int8", "int8_trunc", "int8_round", "fp8"]
_RANGES = {"int8": (127.0, -128.0), "int8_trunc": (127.0, -128.0), "int8_round": (127.0, -128.0), "fp8": (448.0, -448.0)}
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
    q = x.float() * (1.0 / scale)
    if kind == "int8":
        # vLLM >= 0.24: tl.where(q >= 0, q + 0.5, q - 0.5) in float32, then the clamp and the store's truncation
        q = torch.where(q >= 0, q + 0.5, q - 0.5)
    q = torch.clamp(q, quant_min, quant_max)
    if kind in ("int8", "int8_trunc"):
        return torch.trunc(q).to(torch.int8), scale  # the store's fptosi
    if kind == "int8_round":
        return torch.round(q).to(torch.int8), scale
    return q.to(torch.float8_e4m3fn), scale  # round to nearest even; clamped first, so no overflow


def fake_quant_vllm_per_token_head(x: Tensor, kind: PTHKind = "int8") -> Tensor:
    """``x`` as the cache returns it: ``code · scale`` in ``x``'s dtype."""
    q, scale = quantize_vllm_per_token_head(x, kind)
    return (q.float() * scale).to(x.dtype)
