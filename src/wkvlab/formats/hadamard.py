"""Orthonormal Hadamard rotations along the last dimension.

Rotating keys and queries by the same orthonormal matrix leaves every score q·k unchanged, but it
spreads an outlier channel over all channels of its block, so a quantizer with one scale per
block loses far less. llama.cpp (PR #21038, 2026) does this to Q/K/V of quantized caches in blocks
of 64 along head_dim; exllamav3 rotates its cache the same way; QuaRot/SpinQuant rotate weights.

``block`` splits the last dimension into independent blocks (a block-diagonal Hadamard); the
Sylvester construction needs a power of two.
"""
from __future__ import annotations

import functools

import torch

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import device_constant


@functools.lru_cache(maxsize=16)
def hadamard_matrix(n: int) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix of size ``n`` (a power of two), float64."""
    if n < 1 or n & (n - 1):
        raise ConfigError(f"a Hadamard rotation needs a power-of-two size, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def rotate(x: torch.Tensor, block: int, *, inverse: bool = False) -> torch.Tensor:
    """``x`` times a block-diagonal orthonormal Hadamard along the last dim (its transpose if inverse).

    Sylvester matrices are symmetric, so the inverse is the same matrix; ``inverse`` is kept for
    readability at call sites.
    """
    d = x.shape[-1]
    if d % block:
        raise ConfigError(f"rotation block {block} does not divide the head dimension {d}; use a block that divides {d}")
    work = torch.promote_types(x.dtype, torch.float32)  # float32 at least; a float64 tensor stays float64
    h = device_constant(("hadamard", block, work), x.device, lambda device: hadamard_matrix(block).to(dtype=work, device=device))
    blocks = x.to(work).reshape(*x.shape[:-1], d // block, block)
    out = blocks @ (h.T if inverse else h)
    return out.reshape(x.shape).to(x.dtype)
