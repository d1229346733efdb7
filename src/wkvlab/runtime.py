"""Where a model's inputs go and how much memory a run may use.

glibc's allocator is left at its defaults. An earlier version raised its mmap and trim thresholds
to 1 GiB so that the 100 MB tensors of each window were reused from the heap instead of being
mapped afresh (10–20% of a SmolLM2 forward on two cores), but freed heap was then never returned:
on a 3 × 4 grid of Qwen2.5-Coder-0.5B the process peaked at 12.76 GiB against 9.35 GiB without it,
far from the memory estimate a user plans on (docs/scale.md has the measurement on the default model).
"""
from __future__ import annotations


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
