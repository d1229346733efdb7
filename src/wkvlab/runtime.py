"""Where a model's inputs go and how much memory a run may use.

glibc's allocator is left at its defaults. An earlier version raised its mmap and trim thresholds
to 1 GiB so that the 100 MB tensors of each window were reused from the heap instead of being
mapped afresh (10–20% of a SmolLM2 forward on two cores), but freed heap was then never returned:
on a 3 × 4 grid of Qwen2.5-Coder-0.5B the process peaked at 12.76 GiB against 9.35 GiB without it,
far from the memory estimate a user plans on (docs/scale.md has the measurement on the default model).

At its defaults glibc still serves blocks under 32 MiB from the heap (its dynamic mmap threshold
stops there), and a freed block in the middle of the heap stays resident: a chunk's logits at ctx
128 are 25 MB on SmolLM2, and a grid of 32 such windows ended at 1.33 GiB RSS where 0.95 GiB was
live. :func:`release_freed_heap` hands those pages back (``malloc_trim``); the loops that run
window after window call it once per window.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


def input_device(model) -> "torch.device":
    """Where a model's input ids go: its embedding's device (the first GPU of a model spread over several)."""
    return model.get_input_embeddings().weight.device


def device_memory_bytes(device: "torch.device") -> int:
    """Memory a model on ``device`` may use: free GPU memory, or the machine's available RAM."""
    import torch

    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def available_memory(device: str) -> int:
    """Bytes a run on ``device`` may use: free memory of that GPU (all visible GPUs for ``cuda``,
    which spreads a model over them), or the machine's available RAM for ``cpu``."""
    import torch

    if device.startswith("cuda"):
        if ":" in device:
            return device_memory_bytes(torch.device(device))
        return sum(device_memory_bytes(torch.device("cuda", i)) for i in range(torch.cuda.device_count()))
    return device_memory_bytes(torch.device("cpu"))


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS: nothing to release)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_heap() -> None:
    """Return the heap's free pages to the OS (``malloc_trim(0)``: a few milliseconds; changes no value)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
