"""KVQuant (Hooper et al. 2024): non-uniform codebooks, pre-RoPE per-channel keys, sparse outliers.

What is simulated, per layer, from calibration samples (pre-RoPE K and V of held-out text):

* Keys, **before RoPE**, per channel with static calibrated ranges: each channel is normalized by
  the centre and half-width of its calibrated range and snapped to a ``2**bits``-entry codebook
  fitted by 1-D k-means on the normalized calibration keys; RoPE is applied after dequantization.
* Values per token: normalized by the token's own range (per KV head) and snapped to a codebook fit
  the same way on normalized calibration values.
* Dense-and-sparse (``outliers=f``): for keys, values outside the per-channel calibration
  quantiles f/2 and 1 − f/2 are kept in fp16 and the range is those quantiles; for values, the
  ⌈f·head_dim⌉ largest magnitudes of each token are kept in fp16.
* The first token stays fp16 (the preset sets ``sinks=1``).

Deviation, stated: KVQuant weights its k-means by Fisher information (squared gradients), which a
forward-only tool does not have; the codebooks here are unweighted k-means (Lloyd, 30 iterations,
initialized at quantiles, so the fit is deterministic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def fit_codebook(samples: torch.Tensor, bits: int, iters: int = 30) -> torch.Tensor:
    """Sorted ``2**bits`` centroids of 1-D ``samples`` (values in [-1, 1]) by Lloyd's k-means."""
    x = samples.flatten().float()
    n = 2**bits
    centroids = torch.quantile(x, (torch.arange(n, dtype=torch.float32, device=x.device) + 0.5) / n)
    for _ in range(iters):
        index = snap_index(x, centroids)
        sums = torch.zeros(n, device=x.device).index_add_(0, index, x)
        counts = torch.zeros(n, device=x.device).index_add_(0, index, torch.ones_like(x))
        centroids = torch.where(counts > 0, sums / counts.clamp_min(1), centroids).sort().values
    return centroids


def snap_index(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    mids = (codebook[1:] + codebook[:-1]) / 2
    return torch.bucketize(x.contiguous(), mids)


def snap(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    return codebook[snap_index(x, codebook)]


@dataclass
class KVQuantLayer:
    """Calibrated state of one layer: per-channel key ranges ``[kv_heads, head_dim]`` and codebooks."""

    k_lo: torch.Tensor
    k_hi: torch.Tensor
    k_codebook: torch.Tensor
    v_codebook: torch.Tensor
    outliers: float

    def quantize_keys(self, key_pre: torch.Tensor) -> torch.Tensor:
        """Pre-RoPE keys ``[batch, kv_heads, tokens, head_dim]`` as stored (dequantized)."""
        lo, hi = self.k_lo[None, :, None, :], self.k_hi[None, :, None, :]
        centre, half = (hi + lo) / 2, ((hi - lo) / 2).clamp_min(1e-8)
        normalized = ((key_pre - centre) / half).clamp(-1, 1)
        stored = snap(normalized, self.k_codebook) * half + centre
        if self.outliers:
            outside = (key_pre < lo) | (key_pre > hi)
            stored = torch.where(outside, key_pre, stored)
        return stored

    def quantize_values(self, value: torch.Tensor) -> torch.Tensor:
        return quantize_per_token(value, self.v_codebook, self.outliers)


def _keep_largest(x: torch.Tensor, count: int) -> torch.Tensor:
    """Mask of the ``count`` largest magnitudes along the last dim."""
    if count == 0:
        return torch.zeros_like(x, dtype=torch.bool)
    index = x.abs().topk(count, dim=-1).indices
    return torch.zeros_like(x, dtype=torch.bool).scatter_(-1, index, True)


def _token_range(x: torch.Tensor, outliers: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (token, head): the sparse-outlier mask and the centre and half-width of the other values."""
    keep = _keep_largest(x, math.ceil(outliers * x.shape[-1]) if outliers else 0)
    inner = x.masked_fill(keep, float("nan"))
    lo = torch.nan_to_num(inner, nan=float("inf")).amin(-1, keepdim=True)
    hi = torch.nan_to_num(inner, nan=float("-inf")).amax(-1, keepdim=True)
    return keep, (hi + lo) / 2, ((hi - lo) / 2).clamp_min(1e-8)


def quantize_per_token(x: torch.Tensor, codebook: torch.Tensor, outliers: float) -> torch.Tensor:
    """Per (token, head): sparse outliers kept, the rest normalized by its range and snapped."""
    keep, centre, half = _token_range(x, outliers)
    stored = snap(((x - centre) / half).clamp(-1, 1), codebook) * half + centre
    return torch.where(keep, x, stored)


def normalized_per_token(x: torch.Tensor, outliers: float) -> torch.Tensor:
    """Calibration view of values: each token's non-outlier entries mapped to [-1, 1]."""
    keep, centre, half = _token_range(x, outliers)
    return ((x - centre) / half)[~keep]


def fit_layer(k_pre: torch.Tensor, v: torch.Tensor, k_bits: int, v_bits: int, outliers: float) -> KVQuantLayer:
    """Fit one layer from calibration samples ``[kv_heads, tokens, head_dim]`` of pre-RoPE K and V."""
    if outliers:
        q = torch.tensor([outliers / 2, 1 - outliers / 2], device=k_pre.device)
        bounds = torch.quantile(k_pre.transpose(1, 2).float(), q, dim=-1)  # [2, heads, head_dim]
        k_lo, k_hi = bounds[0], bounds[1]
    else:
        k_lo, k_hi = k_pre.amin(1), k_pre.amax(1)
    centre, half = (k_hi + k_lo) / 2, ((k_hi - k_lo) / 2).clamp_min(1e-8)
    k_norm = (k_pre - centre[:, None]) / half[:, None]
    inside = k_norm.abs() <= 1
    return KVQuantLayer(
        k_lo=k_lo, k_hi=k_hi,
        k_codebook=fit_codebook(k_norm[inside], k_bits),
        v_codebook=fit_codebook(normalized_per_token(v.float(), outliers), v_bits),
        outliers=outliers,
    )
