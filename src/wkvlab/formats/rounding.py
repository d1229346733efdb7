"""Rounding modes for quantizers.

Two conventions meet in this package and they disagree only on exact ties (``k + 0.5``):

* ``"half_even"`` — IEEE round-half-to-even, what ``torch.round`` and ``numpy.round`` do and
  what most PyTorch quantization code (GPTQ, AWQ, HQQ, torchao fake quant) therefore uses.
* ``"half_away"`` — round-half-away-from-zero, what C's ``roundf`` does and therefore what
  llama.cpp/ggml uses (``gguf.quants.np_roundf`` re-implements it in numpy for the same reason).

Ties are not rare in practice: a dequantized checkpoint re-quantized with a different scale, or
small integers divided by a power of two, hit them constantly, so the mode changes results.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from wkvlab.errors import ConfigError

Rounding = Literal["half_even", "half_away"]

ROUNDING_MODES: tuple[str, ...] = get_args(Rounding)


def check_rounding(mode: str) -> None:
    """Raise :class:`ConfigError` unless ``mode`` is a known rounding mode."""
    if mode not in ROUNDING_MODES:
        raise ConfigError(f"unknown rounding mode {mode!r}; use one of {', '.join(ROUNDING_MODES)}")


def round_with(x: Tensor, mode: Rounding) -> Tensor:
    """Round ``x`` to integers (same dtype, new tensor) with the given tie-breaking rule.

    ``"half_away"`` uses ``trunc(x) + trunc(2 * (x - trunc(x)))``, the same construction as
    gguf's ``np_roundf``: ``x - trunc(x)`` and its double are exact in binary floating point, so
    the tie test is exact and the result equals C's ``roundf`` for every finite input. The
    textbook ``sign(x) * floor(|x| + 0.5)`` is wrong in float32: ``0.49999997 + 0.5`` rounds to
    ``1.0``, and odd integers above 2**23 gain 0.5 and round to the next even one. NaN and ±inf
    pass through unchanged in both modes.
    """
    check_rounding(mode)
    if mode == "half_even":
        return torch.round(x)
    t = torch.trunc(x)
    frac = torch.nan_to_num(x - t, nan=0.0)  # inf - inf is NaN; ±inf must stay ±inf
    return t + torch.trunc(frac + frac)
