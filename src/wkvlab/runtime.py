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

On a GPU, torch's caching allocator is switched to expandable segments (:func:`use_expandable_segments`)
before CUDA starts: a KV cache that grows by ``torch.cat`` every chunk asks for a slightly larger
block each time, and fixed-size segments leave the freed smaller ones reserved but too small to
reuse, so ``max_memory_reserved`` drifts above what is allocated; expandable segments grow one
mapping in place instead.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import MutableMapping

# torch reads either (PYTORCH_ALLOC_CONF is the newer, device-neutral name); a user's own setting wins
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
EXPANDABLE_SEGMENTS = "expandable_segments:True"


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


def use_expandable_segments(device: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """For a run on a GPU, ask torch's CUDA allocator for expandable segments (``PYTORCH_CUDA_ALLOC_CONF``),
    unless the user set the allocator's variable. Called before anything starts CUDA (the memory
    preflight, the model's load): torch reads the variable once, when CUDA initialises. True when set here."""
    environ = os.environ if environ is None else environ
    if not device.strip().lower().startswith("cuda") or any(name in environ for name in ALLOC_CONF_VARIABLES):
        return False
    environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE_SEGMENTS
    return True


def available_memory(device: str) -> int:
    """Bytes a run on ``device`` may use: free memory of that GPU (all visible GPUs for ``cuda``,
    which spreads a model over them), or the machine's available RAM for ``cpu``."""
    import torch

    if device.startswith("cuda"):
        use_expandable_segments(device)  # mem_get_info starts CUDA: the allocator's setting first
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
