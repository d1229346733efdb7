"""A safetensors file written one tensor at a time.

``safetensors.torch.save_file`` takes every tensor at once, on the host: saving a calibrated
70B build's changed weights (or an in-place run's original-weight snapshot) that way first
copies ~130 GB to RAM. The format (huggingface/safetensors, docs "Format": an 8-byte
little-endian header length, a JSON header of ``{name: {dtype, shape, data_offsets}}`` padded
with spaces to 8 bytes, then the tensors' bytes back to back) only needs the shapes up front, so
here each tensor is copied to the host, written and dropped before the next. Read back with
``safetensors.safe_open`` / ``load_file`` (tested).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Mapping

import torch

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def save_streamed(tensors: Mapping[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (on any device) to ``path`` as safetensors, holding one on the host at a time."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors.values():
            host = t.detach().to("cpu").contiguous().reshape(-1)
            f.write(host.view(torch.uint8).numpy().data)
            del host
