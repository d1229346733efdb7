"""Numeric formats core: pure tensor functions for fake quantization and storage cost.

No modules, no global state, inputs are never modified in place. Three families:

* :mod:`.affine` — integer affine (2..8 bits) per group / row / tensor, symmetric or asymmetric.
* :mod:`.fp8` — FP8 E4M3/E5M2 casts with saturation and absmax scaling.
* :mod:`.fp4` — NVFP4 and MXFP4 (E2M1 values with block scales).
* :mod:`.ggml` — llama.cpp block formats, bit-identical to ``gguf.quants``.
* :mod:`.sizes` — block shapes and byte counts, importable without torch.

User-caused errors (bad bits, group size, unknown name) raise
:class:`wkvlab.errors.ConfigError`.

The tensor functions are imported on first use (PEP 562): byte counts and the spec parsers that
build on them must not pull in torch, so ``import wkvlab.formats.sizes`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

from wkvlab.formats.sizes import FP4_BLOCK, GGML_TYPES, FP4Format, fp4_bytes, ggml_block_shape, ggml_bytes_per_element

_LAZY = {
    "ZeroPoint": "affine", "affine_dequantize": "affine", "affine_qparams": "affine", "affine_quantize": "affine",
    "bytes_per_element_affine": "affine", "fake_quant_affine": "affine",
    "E2M1_MAX": "fp4", "fake_quant_fp4": "fp4", "nvfp4_global_scale": "fp4", "round_e2m1": "fp4",
    "FP8Format": "fp8", "fake_quant_fp8": "fp8", "fp8_absmax_scale": "fp8", "fp8_dtype": "fp8", "fp8_max": "fp8",
    "fake_quant_ggml": "ggml", "ggml_dequantize": "ggml", "ggml_quantize": "ggml",
    "Rounding": "rounding", "round_with": "rounding",
}

__all__ = [
    "Rounding",
    "round_with",
    "ZeroPoint",
    "affine_qparams",
    "affine_quantize",
    "affine_dequantize",
    "fake_quant_affine",
    "bytes_per_element_affine",
    "FP8Format",
    "fp8_dtype",
    "fp8_max",
    "fake_quant_fp8",
    "fp8_absmax_scale",
    "FP4Format",
    "FP4_BLOCK",
    "E2M1_MAX",
    "round_e2m1",
    "nvfp4_global_scale",
    "fake_quant_fp4",
    "fp4_bytes",
    "GGML_TYPES",
    "ggml_block_shape",
    "ggml_bytes_per_element",
    "ggml_quantize",
    "ggml_dequantize",
    "fake_quant_ggml",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"wkvlab.formats.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'wkvlab.formats' has no attribute {name!r}")
