"""Argument checks shared by the format modules.

Every check raises :class:`wkvlab.errors.ConfigError` with a one-line message that says what to
pass instead, because these arguments come straight from user specs (CLI flags, YAML files).
"""
from __future__ import annotations

from typing import Callable, Hashable, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")
_DEVICE_CONSTANTS: dict = {}

from wkvlab.errors import ConfigError


def check_bits(bits: object, *, lo: int = 2, hi: int = 8) -> int:
    """Return ``bits`` if it is an int in ``[lo, hi]``; raise ConfigError otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise ConfigError(f"bits must be an integer from {lo} to {hi}, got {bits!r}")
    return bits


def check_float_tensor(x: object, name: str = "x") -> Tensor:
    """Return ``x`` if it is a floating-point tensor with at least one dimension."""
    if not isinstance(x, Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise ConfigError(f"{name} must be a floating-point tensor, got {x.dtype}; convert it with .float()")
    if x.ndim == 0:
        raise ConfigError(f"{name} must have at least one dimension; reshape it with .reshape(1)")
    return x


def check_group_size(group_size: object, dim: int) -> int:
    """Return the effective group size along a last dimension of length ``dim``.

    ``None`` means one group per row (the whole last dimension).
    """
    if group_size is None:
        if dim == 0:
            raise ConfigError("cannot quantize an empty last dimension; drop the tensor or give it elements")
        return dim
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ConfigError(f"group_size must be a positive integer or None (one group per row), got {group_size!r}")
    if dim % group_size != 0:
        raise ConfigError(
            f"group_size {group_size} does not divide the last dimension ({dim}); "
            f"pick a divisor of {dim} or pass group_size=None for one group per row"
        )
    return group_size


def const_like(ref: Tensor, value: float) -> Tensor:
    """A 0-dim float32 tensor on ``ref``'s device.

    Dividing by a Python number is not always a true division: on CUDA, ``t / 15.0`` is computed
    as ``t * (1/15.0)``, which can be one ulp off. Several exactness guarantees in this package
    (Q4_1 grids, bit-identity with gguf) need correctly rounded division, so divisors are passed
    as device tensors, which always take the true-division kernel. ``torch.full`` fills on the
    device (no host-to-device copy, so no synchronization in the hot path).
    """
    return torch.full((), value, dtype=torch.float32, device=ref.device)


def device_constant(key: Hashable, device: torch.device | str, build: Callable[[torch.device], T]) -> T:
    """``build(device)`` — a format's constant tensor(s): a Hadamard matrix, a codebook, a grid —
    made once per ``(key, device)`` and reused. Built per call, a constant from a Python list or a
    CPU-cached matrix is a host-to-device copy (and a synchronization) on every call of a hot path.
    Callers never modify what this returns."""
    device = torch.device(device)
    entry = (key, device)
    if entry not in _DEVICE_CONSTANTS:
        _DEVICE_CONSTANTS[entry] = build(device)
    return _DEVICE_CONSTANTS[entry]
