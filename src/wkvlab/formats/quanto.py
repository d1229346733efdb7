"""optimum-quanto's affine quantizer as transformers' QuantizedCache(backend="quanto") calls it, in the input's dtype.

huggingface/optimum-quanto v0.2.7 (@089d86ef7954996440ca770b678be353d7a7d6cd), with axis 0 and
``q_group_size`` (transformers 5.24 ``QuantoQuantizedLayer._quantize``):

* ``tensor/grouped.py`` ``group``: the tensor reshaped to ``[numel / group, group]`` (consecutive values);
* ``tensor/optimizers/max_optimizer.py`` ``MaxOptimizer.optimize``: ``rmin``/``rmax`` per group,
  ``scale = (rmax - rmin) / (qmax - qmin)`` (``2^b - 1``), ``shift = -rmin``;
* ``library/quantize.py`` ``quantize_affine``: ``round((base + shift) / scale)`` (half to even),
  ``clamp(0, 2^b - 1)``, stored as uint8;
* ``tensor/qbits.py`` ``QBitsDequantizer``: ``scale * data``, then ``-= shift``.

Every operation runs in the tensor's dtype, as quanto's do: a bf16 cache gets bf16 scales, shifts and
sums (each op rounded to bf16), a float32 one float32 — where this equals ``int<b>-g<G>-asym``
(``fake_quant_affine`` with a float minimum) bit for bit. A group whose scale is 0 (a constant group)
gives ``0/0``: quanto's NaN code is stored as 0 and reads back as ``0 - shift`` = the value itself.
Tested against the installed optimum-quanto in tests/kv/test_quanto_peer.py.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.formats._checks import check_bits, check_float_tensor, check_group_size


def fake_quant_quanto(x: Tensor, bits: int, group: int = 64) -> Tensor:
    """``x`` as quanto's QuantizedCache stores and returns it (same shape and dtype)."""
    check_float_tensor(x)
    check_bits(bits, lo=2, hi=4)
    g = x.reshape(-1, check_group_size(group, x.shape[-1]))  # groups along head_dim: never across tokens
    rmin, rmax = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
    scale = (rmax - rmin) / (2**bits - 1)
    shift = -rmin
    codes = torch.round((g + shift) / scale)
    codes = torch.nan_to_num(codes, nan=0.0).clamp_(0, 2**bits - 1)  # uint8 of NaN: 0 (x86's conversion)
    return (scale * codes - shift).reshape(x.shape)
