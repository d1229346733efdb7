"""``--attn``: the attention implementation transformers runs the model with, checked before loading.

``auto`` keeps transformers' own choice (sdpa where torch has it). ``sdpa`` and ``eager`` always
exist; ``flash_attention_2`` needs the flash-attn package, a CUDA device and 16-bit activations —
its kernels take float16/bfloat16 inputs only. That also rules it out for the KV presets that model
an engine reading dequantized K/V in float32 (``llamacpp:``; :mod:`wkvlab.kv.readprec`): in a 16-bit
run their quantized layers attend in float32, which a flash kernel cannot take. The KV simulation
routes every attention call through the chosen backend (:mod:`wkvlab.kv.override`), so the choice
holds for the reference and every candidate alike. Torch-free unless flash is asked for.
"""
from __future__ import annotations

import importlib.util
from typing import Iterable

from wkvlab.errors import ConfigError

ATTN_CHOICES = ("auto", "sdpa", "eager", "flash_attention_2")
FLASH = "flash_attention_2"


def check_attn(attn: str, *, device: str = "auto", dtype: str = "auto", kv_specs: Iterable = ()) -> str | None:
    """The implementation to load with (None: transformers' default), or a one-line ConfigError."""
    key = attn.strip().lower()
    if key not in ATTN_CHOICES:
        raise ConfigError(f"unknown --attn {attn!r}; use one of {', '.join(ATTN_CHOICES)}")
    if key == "auto":
        return None
    if key != FLASH:
        return key
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("--attn flash_attention_2: the flash-attn package is not installed in this environment "
                          "(pip install flash-attn, on a CUDA machine); use --attn sdpa or eager")
    from wkvlab.models.loading import resolve_device, resolve_dtype

    resolved = resolve_device(device)
    if resolved == "cpu":
        raise ConfigError("--attn flash_attention_2 runs on CUDA only and this run is on the CPU; use --attn sdpa or eager")
    if resolve_dtype(dtype, resolved) == "float32":
        raise ConfigError("--attn flash_attention_2: flash kernels take float16/bfloat16 only and this run is float32; "
                          "use --dtype bfloat16 or --attn sdpa")
    for spec in kv_specs:
        reason = float32_kv_reason(spec.name)
        if reason:
            raise ConfigError(f"{spec.label}: {reason}, and flash kernels take 16-bit inputs only; use --attn sdpa or eager for it")
    return key


def float32_kv_reason(spec_name: str) -> str | None:
    """Why a KV preset's quantized layers attend in float32 (None when they follow the run's dtype)."""
    from wkvlab.kv.readprec import engine_read

    if engine_read(spec_name) != "float32":
        return None
    family = spec_name.partition(":")[0]
    return (f"{family} reads dequantized K/V in float32 (llama.cpp's CPU flash attention never rounds them to 16 bits; "
            "kv/readprec.py), so its quantized layers attend in float32")
