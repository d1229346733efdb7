"""Process-level settings that make long CPU evaluations cheaper; nothing here changes a number.

An evaluation allocates several tensors of 100 MB or more per window (logits, log-probs, probs).
glibc serves allocations that large with fresh ``mmap`` calls and unmaps them on free, so every
window page-faults the same memory back in — measured at 10–20% of a SmolLM2 forward pass on two
cores. Raising glibc's mmap and trim thresholds keeps freed blocks in the heap for reuse.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_REUSE_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed large blocks instead of returning them to the OS (idempotent)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune, numbers unaffected
        log.debug("mallopt unavailable; large allocations keep the platform default")
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(_REUSE_BYTES)) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(_REUSE_BYTES)) == 1 and ok
    return ok


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
