"""Weight (and activation) quantization: the spec, pure per-matrix methods, and model application.

Methods: round-to-nearest (:mod:`.rtn`), GPTQ (:mod:`.gptq`), AWQ (:mod:`.awq`), SmoothQuant
(:mod:`.smoothquant`), LLM.int8() and W8A8/W4A4 activation quantization (:mod:`.activations`);
architecture mappings as data (:mod:`.arch`); calibration text (:mod:`.calibration`); the
layer-wise calibration pipeline (:mod:`.capture`); the on-disk cache (:mod:`.cache`); quantized
checkpoints on disk as candidates and their writers (:mod:`.checkpoints`, ``checkpoint:<path>``).
"""
from __future__ import annotations

from wkvlab.weights.activations import ActivationQuant, fake_quant_activation
from wkvlab.weights.apply import QuantizedWeights, decoder_linears, model_weight_bytes, quantize_model_weights, resolve_linears
from wkvlab.weights.calibration import DOMAINS, CalibrationSet, CalibrationSpec, calibration_corpus, calibration_set, math_text
from wkvlab.weights.gptq import gptq_quantize
from wkvlab.weights.parse import PRESETS, parse_weight_spec, preset_names
from wkvlab.weights.rtn import quantize_weight, weight_storage_bytes
from wkvlab.weights.spec import WeightSpec

__all__ = [
    "ActivationQuant", "fake_quant_activation", "QuantizedWeights", "decoder_linears", "model_weight_bytes",
    "quantize_model_weights", "resolve_linears", "DOMAINS", "CalibrationSet", "CalibrationSpec", "calibration_corpus",
    "calibration_set", "math_text", "gptq_quantize", "PRESETS", "parse_weight_spec", "preset_names", "quantize_weight",
    "weight_storage_bytes", "WeightSpec",
]
