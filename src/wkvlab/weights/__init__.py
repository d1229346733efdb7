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

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("activations", "ActivationQuant", "fake_quant_activation"),
    **names("apply", "QuantizedWeights", "decoder_linears", "model_weight_bytes", "quantize_model_weights", "resolve_linears"),
    **names("calibration", "DOMAINS", "CalibrationSet", "CalibrationSpec", "calibration_corpus", "calibration_set", "math_text"),
    **names("gptq", "gptq_quantize"),
    **names("parse", "PRESETS", "parse_weight_spec", "preset_names"),
    **names("rtn", "quantize_weight"),
    **names("storage", "weight_storage_bytes"),
    **names("spec", "WeightSpec"),
}
__all__ = [
    "ActivationQuant", "fake_quant_activation", "QuantizedWeights", "decoder_linears", "model_weight_bytes",
    "quantize_model_weights", "resolve_linears", "DOMAINS", "CalibrationSet", "CalibrationSpec", "calibration_corpus",
    "calibration_set", "math_text", "gptq_quantize", "PRESETS", "parse_weight_spec", "preset_names", "quantize_weight",
    "weight_storage_bytes", "WeightSpec",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
