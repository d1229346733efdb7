"""Weight (and activation) quantization: the spec, pure per-matrix methods, and model application.

Methods: round-to-nearest (:mod:`.rtn`), GPTQ (:mod:`.gptq`), AWQ (:mod:`.awq`), SmoothQuant
(:mod:`.smoothquant`), LLM.int8() and W8A8/W4A4 activation quantization (:mod:`.activations`);
architecture mappings as data (:mod:`.arch`); calibration text (:mod:`.calibration`); the
layer-wise calibration pipeline (:mod:`.capture`); the on-disk cache (:mod:`.cache`); quantized
checkpoints on disk as candidates and their writers (:mod:`.checkpoints`, ``checkpoint:<path>``).

The spec, its parser and the storage byte counts (:mod:`.spec`, :mod:`.parse`, :mod:`.storage`)
import without torch; everything else is imported on first use (PEP 562), so a command that only
parses or plans never loads torch.
"""
from __future__ import annotations

import importlib
from typing import Any

from wkvlab.weights.parse import PRESETS, parse_weight_spec, preset_names
from wkvlab.weights.spec import WeightSpec
from wkvlab.weights.storage import weight_storage_bytes

_LAZY = {
    "ActivationQuant": "activations", "fake_quant_activation": "activations",
    "QuantizedWeights": "apply", "decoder_linears": "apply", "model_weight_bytes": "apply",
    "quantize_model_weights": "apply", "resolve_linears": "apply",
    "DOMAINS": "calibration", "CalibrationSet": "calibration", "CalibrationSpec": "calibration",
    "calibration_corpus": "calibration", "calibration_set": "calibration", "math_text": "calibration",
    "gptq_quantize": "gptq", "quantize_weight": "rtn",
}

__all__ = [
    "ActivationQuant", "fake_quant_activation", "QuantizedWeights", "decoder_linears", "model_weight_bytes",
    "quantize_model_weights", "resolve_linears", "DOMAINS", "CalibrationSet", "CalibrationSpec", "calibration_corpus",
    "calibration_set", "math_text", "gptq_quantize", "PRESETS", "parse_weight_spec", "preset_names", "quantize_weight",
    "weight_storage_bytes", "WeightSpec",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"wkvlab.weights.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'wkvlab.weights' has no attribute {name!r}")
