"""TokenArrays ↔ compact blobs, bit-exact both ways.

Each array is stored as raw little-endian bytes with its dtype and shape, narrowed only when the
narrowing is lossless: the runner's float64 arrays hold values computed in float32 (``.double()``
of float32 tensors), so they fit float32 exactly and take half the room; positions and window
indices fit int32. A value that would not survive the round trip keeps its original dtype, so
reading back always gives the same dtype and the same bits (NaN included).
"""
from __future__ import annotations

import json
from dataclasses import fields

import numpy as np

from wkvlab.eval.result import TokenArrays

ARRAY_NAMES = tuple(f.name for f in fields(TokenArrays))
_NARROWER = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32)}


def _narrow(a: np.ndarray) -> np.ndarray:
    target = _NARROWER.get(a.dtype)
    if target is None:
        return a
    if target.kind == "i" and a.size and (a.min() < np.iinfo(target).min or a.max() > np.iinfo(target).max):
        return a
    with np.errstate(over="ignore", invalid="ignore"):
        small = a.astype(target)
    return small if np.array_equal(small.astype(a.dtype), a, equal_nan=target.kind == "f") else a


def encode_array(a: np.ndarray) -> tuple[str, bytes]:
    """(metadata JSON, bytes) for one array; metadata names the original and the stored dtype."""
    a = np.ascontiguousarray(a)
    stored = _narrow(a)
    stored = stored.astype(stored.dtype.newbyteorder("<"), copy=False)
    meta = {"dtype": a.dtype.str, "stored": stored.dtype.str, "shape": list(a.shape)}
    return json.dumps(meta), stored.tobytes()


def decode_array(meta_json: str, blob: bytes) -> np.ndarray:
    meta = json.loads(meta_json)
    stored = np.frombuffer(blob, dtype=np.dtype(meta["stored"])).reshape(meta["shape"])
    return stored.astype(np.dtype(meta["dtype"]).newbyteorder("="))  # astype copies: the result is writable


OPTIONAL = ("document",)  # rows a result may lack: stored before documents were recorded, or one stream


def encode_token_arrays(arrays: TokenArrays) -> list[tuple[str, str, bytes]]:
    """(name, metadata, bytes) per field of :class:`TokenArrays` (an absent optional one: no row)."""
    return [(name, *encode_array(getattr(arrays, name))) for name in ARRAY_NAMES if getattr(arrays, name) is not None]


def decode_token_arrays(rows: list[tuple[str, str, bytes]]) -> TokenArrays:
    """Without a ``document`` row the result reads as one stream (its windows are the units)."""
    by_name = {name: decode_array(meta, blob) for name, meta, blob in rows}
    missing = set(ARRAY_NAMES) - set(OPTIONAL) - set(by_name)
    if missing:
        raise ValueError(f"stored result lacks arrays {sorted(missing)}")
    return TokenArrays(**{name: by_name.get(name) for name in ARRAY_NAMES})
