"""Resampling units for long windows, and bucket means as bootstrap statistics.

A long-context run has few windows (65,536 tokens at ctx 32,768 are two), too few to resample.
Within a window, per-token KLD is correlated only over short distances, so the window is cut into
blocks of consecutive positions and the blocks are resampled (a block bootstrap). A block must be
much longer than the distance over which per-token values stay correlated:
:func:`decorrelation_lag` measures that distance on the run itself and the depth tables print it
next to the block length, so a reader can see whether the blocks are long enough (nothing
lengthens the blocks automatically; ``depth_tables(block=...)`` takes another length).

Bucket means (the mean of an array over the tokens whose position falls in a bucket) are ratios
of two token-weighted means — masked sum over masked count — so they, and differences between
buckets, are statistics :func:`wkvlab.stats.paired_interval` takes directly.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

DEFAULT_BLOCK = 256


def block_units(window: np.ndarray, position: np.ndarray, block: int = DEFAULT_BLOCK) -> np.ndarray:
    """A unit label per token: its window and its block of ``block`` consecutive positions."""
    if block < 1:
        raise ValueError(f"block must be positive, got {block}")
    window, position = np.asarray(window, dtype=np.int64), np.asarray(position, dtype=np.int64)
    per_window = int(position.max()) // block + 1 if position.size else 1
    return window * per_window + position // block


def decorrelation_lag(values: np.ndarray, window: np.ndarray, threshold: float = 0.05, max_lag: int = 512) -> int:
    """The smallest lag at which the autocorrelation of ``values`` within windows falls below ``threshold``.

    Pairs never cross a window boundary. Returns ``max_lag`` when it never falls that low (then
    blocks of that length or longer are needed).
    """
    values, window = np.asarray(values, dtype=np.float64), np.asarray(window)
    centred = values - values.mean()
    variance = float(np.mean(centred ** 2))
    if variance == 0.0:
        return 1
    for lag in range(1, max_lag):
        same = window[lag:] == window[:-lag]
        if not same.any():
            return lag
        correlation = float(np.mean(centred[lag:][same] * centred[:-lag][same])) / variance
        if correlation < threshold:
            return lag
    return max_lag


def bucket_arrays(arrays: Mapping[str, np.ndarray], position: np.ndarray, buckets: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """``name@start`` (values masked to the bucket) and ``n@start`` (the mask) for every bucket."""
    out: dict[str, np.ndarray] = {}
    for start, end in buckets:
        mask = ((position >= start) & (position < end)).astype(np.float64)
        out[f"n@{start}"] = mask
        for name, values in arrays.items():
            out[f"{name}@{start}"] = np.asarray(values, dtype=np.float64) * mask
    return out


def bucket_mean(name: str, start: int) -> Callable[[Mapping], np.ndarray | float]:
    """Statistic: the mean of array ``name`` over the bucket starting at ``start``."""
    return lambda m: m[f"{name}@{start}"] / m[f"n@{start}"]
