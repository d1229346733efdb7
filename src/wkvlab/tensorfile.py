"""A safetensors file written one tensor at a time.

``safetensors.torch.save_file`` takes every tensor at once, on the CPU: for a model on a GPU that
means a host copy of all of them before the first byte is written (the whole decoder, 131 GiB on
a 70B model), and for a model being converted the converted copy beside its source. Here the header
is made from shapes and dtypes alone, then each tensor is moved to the host, written and dropped,
so what is held beyond the tensors themselves is one tensor. The file is the format safetensors
reads (8-byte header length, JSON header, the data in header order), tested against its reader.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch

_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
           torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
           torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_tensors(path: Path, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]], tensor: Callable[[str], torch.Tensor],
                  metadata: dict[str, str] | None = None) -> None:
    """Write ``tensor(name)`` for each name of ``shapes`` (its shape and dtype, known beforehand)
    to ``path``; each is fetched, written and released before the next."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (shape, dtype) in shapes.items():
        if dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {dtype} has no safetensors name")
        size = dtype.itemsize * _numel(shape)
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as handle:
        handle.write(len(encoded).to_bytes(8, "little"))
        handle.write(encoded)
        for name, (shape, dtype) in shapes.items():
            value = tensor(name).detach().to("cpu").contiguous()
            if tuple(value.shape) != tuple(shape) or value.dtype != dtype:
                raise ValueError(f"{name} is {tuple(value.shape)} {value.dtype}, the header says {tuple(shape)} {dtype}")
            handle.write(value.reshape(-1).view(torch.uint8).numpy().data if value.numel() else b"")
            del value
        handle.flush()
        os.fsync(handle.fileno())


def write_state(path: Path, tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> None:
    """:func:`write_tensors` for tensors already at hand (a model's own, on any device): the file
    is written without a second copy of them on the host."""
    by_name = dict(tensors)
    write_tensors(path, {n: (tuple(t.shape), t.dtype) for n, t in by_name.items()}, by_name.__getitem__, metadata)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
