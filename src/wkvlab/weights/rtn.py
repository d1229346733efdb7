"""Round-to-nearest weight quantization of one matrix, as a pure function.

Groups run along the input dimension (columns), one set per output row, as in GPTQ/AWQ
checkpoints. When the group size does not divide the number of columns the last group is shorter:
that is what GPTQ's reference implementation does (a new group starts every G columns), while
vLLM's Marlin kernels refuse such shapes — :func:`ragged_group_note` says so to the user.
"""
from __future__ import annotations

import torch

from wkvlab.formats import fake_quant_affine, fake_quant_fp4, fake_quant_fp8, fake_quant_ggml, fp8_absmax_scale
from wkvlab.weights.spec import GGML_FORMATS, WeightSpec
from wkvlab.weights.storage import weight_storage_bytes  # noqa: F401  (kept importable from here)


def _affine_rows(w: torch.Tensor, spec: WeightSpec, group: int | None) -> torch.Tensor:
    return fake_quant_affine(w, spec.bits, group_size=group, symmetric=spec.symmetric, zero_point=spec.zero_point)


def group_spans(columns: int, group: int | None) -> list[tuple[int, int]]:
    """Column ranges sharing a scale: every ``group`` columns, the last one possibly shorter."""
    step = columns if group is None or group >= columns else group
    return [(start, min(start + step, columns)) for start in range(0, columns, step)]


def quantize_weight(w: torch.Tensor, spec: WeightSpec) -> torch.Tensor:
    """Fake-quantized copy of a ``[out, in]`` weight (same dtype), as ``spec`` stores it."""
    if spec.method == "none":
        return w.clone()
    if spec.method == "cast":
        dtype = torch.bfloat16 if spec.format == "bf16" else torch.float16
        return w.to(dtype).to(w.dtype)
    if spec.format == "fp8_e4m3":
        scale = fp8_absmax_scale(w.float(), "e4m3", dim=None if spec.per_tensor else 1)  # per tensor or output channel
        return fake_quant_fp8(w.float(), "e4m3", scale).to(w.dtype)
    if spec.format in ("nvfp4", "mxfp4"):
        return fake_quant_fp4(w.float(), spec.format).to(w.dtype)  # type: ignore[arg-type]
    if spec.format in GGML_FORMATS:
        # llama.cpp blocks of 32 along the input (bit-exact with gguf.quants, ntry as llama-quantize)
        return fake_quant_ggml(w.float(), spec.format).to(w.dtype)
    if spec.per_tensor:
        return fake_quant_affine(w.float(), spec.bits, symmetric=spec.symmetric, zero_point=spec.zero_point, per_tensor=True).to(w.dtype)
    columns = w.shape[1]
    group = spec.group_size
    if group is None or group >= columns or columns % group == 0:
        g = None if group is None or group >= columns else group
        return _affine_rows(w.float(), spec, g).to(w.dtype)
    cut = columns - columns % group
    head = _affine_rows(w[:, :cut].float(), spec, group)
    tail = _affine_rows(w[:, cut:].float(), spec, None)
    return torch.cat([head, tail], dim=1).to(w.dtype)


def ragged_group_note(shapes: list[tuple[int, int]], spec: WeightSpec) -> str | None:
    """A one-line note when some layers' columns are not a multiple of the group size."""
    if spec.group_size is None or spec.format != "int":
        return None
    ragged = sorted({cols for _, cols in shapes if cols % spec.group_size})
    if not ragged:
        return None
    return (
        f"{spec.label}: input widths {ragged} are not multiples of {spec.group_size}, so each row's last group is shorter "
        f"(as in GPTQ's reference); vLLM's Marlin kernels refuse such shapes"
    )
