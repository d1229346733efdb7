"""What a weight matrix costs in bytes, as an engine stores it — without torch.

One definition serves the evaluation (``EvalResult.weight_bytes``), the search (weight layers kept
at 16 bits) and the planner (a model description it has not loaded), so a measured result and
its planned bytes always describe the same format.
"""
from __future__ import annotations

from wkvlab.formats.sizes import fp4_bytes, ggml_block_shape
from wkvlab.weights.spec import GGML_FORMATS, WeightSpec


def weight_storage_bytes(shape: tuple[int, int], spec: WeightSpec) -> float:
    """Bytes an engine holds for a ``[out, in]`` weight in this format, scales and zero points included."""
    rows, columns = shape
    if spec.method == "none":
        return rows * columns * 4.0
    if spec.method == "cast":
        return rows * columns * 2.0
    if spec.format == "fp8_e4m3":
        # fp32 scales per channel (or one per tensor), as compressed-tensors stores FP8 checkpoints
        return rows * columns * 1.0 + (1 if spec.per_tensor else rows) * 4.0
    if spec.format in ("nvfp4", "mxfp4"):
        return float(fp4_bytes(rows, columns, spec.format))  # type: ignore[arg-type]
    if spec.format in GGML_FORMATS:
        values, nbytes = ggml_block_shape(spec.format)  # blocks along the input, scales inside
        return rows * -(-columns // values) * float(nbytes)
    if spec.method == "llm-int8":
        return rows * columns + rows * 4.0  # bitsandbytes keeps one fp32 absmax (SCB) per row
    if spec.per_tensor:
        return rows * columns * spec.bits / 8 + 2.0 + (0.0 if spec.symmetric else (2.0 if spec.zero_point == "float" else 1.0))
    # GPTQ checkpoints store g_idx, one int32 per input column, with or without act-order.
    g_idx = columns * 4.0 if spec.method == "gptq" else 0.0
    group = spec.group_size or columns
    groups_per_row = -(-columns // group)
    per_group = 2.0  # fp16 scale
    if not spec.symmetric:
        per_group += 2.0 if spec.zero_point == "float" else spec.bits / 8
    return rows * columns * spec.bits / 8 + rows * groups_per_row * per_group + g_idx
