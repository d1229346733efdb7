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

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("affine", "ZeroPoint", "affine_dequantize", "affine_qparams", "affine_quantize", "bytes_per_element_affine", "fake_quant_affine"),
    **names("fp4", "E2M1_MAX", "fake_quant_fp4", "nvfp4_global_scale", "round_e2m1"),
    **names("fp8", "FP8Format", "fake_quant_fp8", "fake_quant_fp8_torch_cast", "fp8_absmax_scale", "fp8_dtype", "fp8_max"),
    **names("ggml", "fake_quant_ggml", "fake_quant_q8_K", "ggml_dequantize", "ggml_quantize"),
    **names("rounding", "Rounding", "round_with"),
    # byte counts and block shapes: torch-free (the planner and the parsers need them)
    **names("sizes", "FP4_BLOCK", "FP4Format", "GGML_TYPES", "fp4_bytes", "ggml_block_shape", "ggml_bytes_per_element"),
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
    "fake_quant_fp8_torch_cast",
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
    "fake_quant_q8_K",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
