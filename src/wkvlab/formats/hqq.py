"""HQQ's quantizer as transformers' ``QuantizedCache(backend="hqq")`` calls it on the KV cache.

transformers 5.24 ``src/transformers/cache_utils.py`` ``HQQQuantizedLayer._quantize`` calls
``hqq.core.quantize.Quantizer.quantize(tensor, axis, device, compute_dtype, nbits, group_size)`` on
the whole ``[batch, kv_heads, tokens, head_dim]`` cache, with hqq's defaults otherwise
(``channel_wise=True, optimize=True, round_zero=False, bitpack=True``), then casts scale and zero
to the cache's dtype (``Quantizer.cuda`` → ``to_inplace``, ``meta["compute_dtype"]`` = the keys'
dtype). Transcribed from mobiusml/hqq@e0b1d00e (0.2.8.post1, the PyPI release),
``hqq/core/quantize.py`` ``Quantizer.quantize``/``dequantize`` and ``hqq/core/optimize.py``
``optimize_weights_proximal_legacy`` (what ``optimize_weights_proximal`` names):

* grouping: the cache is flattened and reshaped to ``[group_size, -1]`` for ``axis=0`` (the
  transformers default; a group is a *column*: ``group_size`` values spaced ``numel/group_size``
  apart in the flat tensor, so which values share a group depends on the cache's length) or to
  ``[-1, group_size]`` for ``axis=1`` (``group_size`` consecutive values: one token's head_dim
  when they are equal);
* per group: ``scale = (2^b - 1) / (max - min)`` (1 where ``|max - min| <= 1e-4``, clamped at
  2e4), ``zero = -min * scale`` (not rounded);
* the proximal zero-point solver, up to 20 steps with lp_norm 0.7, beta 10 (the legacy solver
  never multiplies beta by kappa): ``W_q = clamp(round(W*scale + zero), 0, 2^b - 1)``,
  ``W_r = (W_q - zero)/scale``, ``W_e = shrink_lp(W - W_r)``, ``zero = mean(W_q - (W - W_e)*scale)``
  over the group; it stops after the first step whose mean |W - W_r| over the *whole tensor* is
  not below the best so far, keeping that step's updated zero. On CUDA it runs in float16 (hqq
  picks ``float16 if device.type == "cuda" else float32``), on CPU in float32;
* codes ``clamp(round(W*scale + zero), 0, 2^b - 1)`` with the final zero, stored scale ``1/scale``;
  dequantized in the cache dtype as ``(W_q - zero) * scale``.

The global early stop makes the result depend on every value of the tensor passed: one sequence
(``QuantizedCache`` under ``generate`` with batch 1) is one tensor here, each batch row on its own.
"""
from __future__ import annotations

import torch

LP_NORM, BETA, ITERS = 0.7, 10.0, 20  # optimize_weights_proximal_legacy's opt_params


def _shrink_lp(x: torch.Tensor, beta: float, lp_norm: float) -> torch.Tensor:
    """hqq ``shrink_lp_op`` (lp_norm < 1 branch), same operations in the same order."""
    out = torch.abs(x)
    out.sub_((1.0 / beta) * out.pow(lp_norm - 1)).clamp_min_(0.0)
    out.mul_(torch.sign(x))
    return out


def _quantize_one(tensor: torch.Tensor, nbits: int, group_size: int, axis: int, work: torch.dtype) -> torch.Tensor:
    W = tensor.float()
    shape = W.shape
    W = W.reshape([-1, group_size]) if axis == 1 else W.reshape([group_size, -1])
    _min = W.min(axis=axis, keepdim=True)[0]
    _max = W.max(axis=axis, keepdim=True)[0]
    max_v = round(2**nbits - 1)
    denom = _max - _min
    scale = max_v / denom
    scale = torch.where(denom.abs() <= 1e-4, torch.full_like(scale, 1.0), scale)
    scale = scale.clamp(max=2e4)
    zero = -_min * scale
    # optimize_weights_proximal_legacy(tensor=W, scale, zero, min_max=[0, max_v], axis, device)
    W_f, scale, zero = W.to(work), scale.to(work), zero.to(work)
    best_error = torch.tensor(torch.inf, dtype=torch.float32, device=W.device)
    for _ in range(ITERS):
        W_q = torch.round(W_f * scale + zero).clamp_(0, max_v)
        W_r = (W_q - zero) / scale
        W_e = _shrink_lp(W_f - W_r, BETA, LP_NORM)
        zero = torch.mean(W_q - (W_f - W_e) * scale, axis=axis, keepdim=True)
        current_error = torch.abs(W_f - W_r).mean().float()
        if current_error < best_error:
            best_error = current_error
        else:
            break
    W_q = torch.round(W * scale + zero).clamp_(0, max_v)
    scale = 1.0 / scale
    # Quantizer.cuda -> to_inplace: scale and zero cast to compute_dtype; dequantize unpacks the codes to it
    dtype = tensor.dtype
    return ((W_q.to(dtype) - zero.to(dtype)) * scale.to(dtype)).reshape(shape)


def fake_quant_hqq(x: torch.Tensor, nbits: int, group_size: int = 64, axis: int = 0) -> torch.Tensor:
    """Quantize-dequantize ``x`` ``[batch, heads, tokens, head_dim]`` as HQQ does one sequence's cache.

    Returns ``x``'s dtype (the cache's compute dtype). Each batch row is quantized as its own tensor.
    """
    if x.shape[-2] == 0:
        return x.clone()
    if x[0].numel() % group_size:
        raise ValueError(f"HQQ needs the cache's size {x[0].numel()} to be a multiple of group_size {group_size}")
    work = torch.float16 if x.device.type == "cuda" else torch.float32
    return torch.stack([_quantize_one(row, nbits, group_size, axis, work) for row in x])
