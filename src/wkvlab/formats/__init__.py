"""Numeric formats core: pure tensor functions for fake quantization and storage cost.

No modules, no global state, inputs are never modified in place. Three families:

* :mod:`.affine` — integer affine (2..8 bits) per group / row / tensor, symmetric or asymmetric.
* :mod:`.fp8` — FP8 E4M3/E5M2 casts with saturation and absmax scaling.
* :mod:`.fp4` — NVFP4 and MXFP4 (E2M1 values with block scales).
* :mod:`.ggml` — llama.cpp block formats, bit-identical to ``gguf.quants``.

User-caused errors (bad bits, group size, unknown name) raise
:class:`wkvlab.errors.ConfigError`.
"""
from __future__ import annotations

from wkvlab.formats.affine import (
    ZeroPoint,
    affine_dequantize,
    affine_qparams,
    affine_quantize,
    bytes_per_element_affine,
    fake_quant_affine,
)
from wkvlab.formats.fp4 import E2M1_MAX, FP4_BLOCK, FP4Format, fake_quant_fp4, fp4_bytes, nvfp4_global_scale, round_e2m1
from wkvlab.formats.fp8 import FP8Format, fake_quant_fp8, fp8_absmax_scale, fp8_dtype, fp8_max
from wkvlab.formats.ggml import (
    GGML_TYPES,
    fake_quant_ggml,
    ggml_block_shape,
    ggml_bytes_per_element,
    ggml_dequantize,
    ggml_quantize,
    fake_quant_q8_K,
)
from wkvlab.formats.rounding import Rounding, round_with

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
    "fake_quant_q8_K",
]
