"""Weight (and activation) quantization: the spec, pure per-matrix methods, and model application."""
from __future__ import annotations

from wkvlab.weights.apply import QuantizedWeights, decoder_linears, model_weight_bytes, quantize_model_weights
from wkvlab.weights.rtn import quantize_weight, weight_storage_bytes
from wkvlab.weights.spec import WeightSpec

__all__ = ["QuantizedWeights", "decoder_linears", "model_weight_bytes", "quantize_model_weights", "quantize_weight", "weight_storage_bytes", "WeightSpec"]
