"""Activation quantization at a linear layer's input: pure functions plus the hooks that apply them.

Engines quantize the *input* of a W8A8/W4A4 GEMM just before the matmul, so a forward pre-hook on
each quantized linear of the model copy is a faithful simulation. Scales:

* ``int8-token`` / ``fp8-token`` — dynamic, one per token (absmax over the input features), as
  vLLM's W8A8 INT8 (``scaled_int8_quant``) and FP8 (``scaled_fp8_quant(..., use_per_token_if_dynamic)``) do.
* ``int8-tensor`` / ``fp8-tensor`` — static, one per tensor, the calibration absmax mapped onto the
  format's largest value (llm-compressor's static minmax observer; TensorRT-LLM's per-tensor mode).
* ``nvfp4`` — blocks of 16 with an E4M3 scale each and a static fp32 global scale from the
  calibration absmax (modelopt's ``input_scale``); ``mxfp4`` — blocks of 32, E8M0 scales, no
  global scale.
* ``llm-int8`` — LLM.int8()'s decomposition (Dettmers et al. 2022, bitsandbytes
  ``MatMul8bitLt``): input columns where any token exceeds ``threshold`` in magnitude stay at 16
  bits, the rest are INT8 per token. Outlier columns are chosen over the whole batch — in a
  teacher-forced window, the window, as in a prefill.
* ``ggml-q8`` — llama.cpp's CPU matmul of a quantized weight: ggml-cpu first converts the input
  rows to the weight type's ``vec_dot_type`` — q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL weights, q8_1 for
  Q4_1/Q5_1 (q8_1 rounds exactly as q8_0 and also stores the block sum, which only re-adds the
  weight's minimum) — blocks of 32 with an fp16 scale, bit-exact with ``gguf.quants`` q8_0.
* ``ggml-q8k`` — the same for K-quant weights (Q2_K..Q6_K, IQ4_XS): q8_K, blocks of 256 with a
  float32 scale and round-half-to-even codes (:func:`wkvlab.formats.fake_quant_q8_K`).
* ``ggml-f16`` / ``ggml-bf16`` — F16 / BF16 weights: ggml-cpu converts the input rows to fp16 /
  bf16 (their vec_dot_type) before the dot products.

Each spec is a small frozen record so a quantized model can be cached and rebuilt exactly.
Static kinds take their scale from ``amax`` (calibrated here) or, for a checkpoint that stores it,
from ``scale`` directly: the fp32 ``input_scale`` of a static INT8/FP8 checkpoint, or NVFP4's
per-tensor scale (``1 / input_global_scale`` of compressed-tensors).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from wkvlab.formats import fake_quant_affine, fake_quant_ggml, fake_quant_q8_K, fake_quant_fp4, fake_quant_fp8, fp8_absmax_scale, fp8_max, nvfp4_global_scale

_INT8_MAX = 127.0


@dataclass(frozen=True)
class ActivationQuant:
    """How one linear's input is quantized; ``amax`` is the calibrated absmax of static kinds."""

    kind: str
    amax: float | None = None
    threshold: float = 6.0
    scale: float | None = None  # a stored static scale (checkpoints); wins over amax

    def static_scale(self, format_max: float) -> float:
        """The per-tensor scale: the stored one, else calibrated ``amax / format_max`` (1.0 for amax 0)."""
        if self.scale is not None:
            return self.scale
        amax = self.amax or 0.0
        return amax / format_max if amax > 0 else 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def _int8_static(x: Tensor, scale: float) -> Tensor:
    return (torch.round(x / scale).clamp_(-128, 127) * scale).to(x.dtype)


def _llm_int8(x: Tensor, threshold: float) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])
    outliers = flat.abs().amax(dim=0) > threshold  # bitsandbytes: any row of the batch above threshold
    inliers = torch.where(outliers, torch.zeros_like(x), x)
    quantized = fake_quant_affine(inliers, 8, symmetric=True)  # per token over the inlier columns
    return torch.where(outliers, x, quantized)


@functools.lru_cache(maxsize=4096)
def _nvfp4_scale(quant: ActivationQuant) -> float:
    """NVFP4's static global scale as a float32-rounded Python number, computed once per spec on
    the host (a CPU tensor, so no device waits): :func:`fake_quant_fp4` fills it on the input's
    device, where a CPU scalar tensor would be copied per quantized linear per forward."""
    if quant.scale is not None:
        return float(torch.tensor(quant.scale, dtype=torch.float32))
    return float(nvfp4_global_scale(quant.amax or 0.0))


def fake_quant_activation(x: Tensor, quant: ActivationQuant) -> Tensor:
    """The input a quantized GEMM sees for ``x`` (``[..., features]``); same shape and dtype."""
    kind = quant.kind
    if kind == "int8-token":
        return fake_quant_affine(x, 8, symmetric=True)
    if kind == "fp8-token":
        return fake_quant_fp8(x, "e4m3", fp8_absmax_scale(x, "e4m3", dim=-1))
    if kind == "fp8-tensor":
        return fake_quant_fp8(x, "e4m3", quant.static_scale(fp8_max("e4m3")))
    if kind == "int8-tensor":
        return _int8_static(x, quant.static_scale(_INT8_MAX))
    if kind == "nvfp4":
        return fake_quant_fp4(x, "nvfp4", _nvfp4_scale(quant))
    if kind == "mxfp4":
        return fake_quant_fp4(x, "mxfp4")
    if kind == "llm-int8":
        return _llm_int8(x, quant.threshold)
    if kind == "ggml-q8":
        return fake_quant_ggml(x, "q8_0").to(x.dtype)
    if kind == "ggml-q8k":
        return fake_quant_q8_K(x).to(x.dtype)
    if kind == "ggml-f16":
        return x.to(torch.float16).to(x.dtype)
    if kind == "ggml-bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    raise ValueError(f"unknown activation quantization {kind!r}")  # specs are validated before this


def attach_activation_quantizers(model: torch.nn.Module, plan: dict[str, ActivationQuant]) -> list:
    """Register a forward pre-hook per planned linear (or experts module, whose ``<name>.gated``
    entry quantizes its down_proj's input); returns the handles (removed with ``.remove()``)."""
    from wkvlab.weights.experts import GATED, wrap_gated

    modules = dict(model.named_modules())
    handles = []
    for name, quant in plan.items():
        if name.endswith(GATED):  # fused MoE experts: down_proj's input is the gate's output (wkvlab.weights.experts)
            handles.append(wrap_gated(modules[name[: -len(GATED)]], lambda x, quant=quant: fake_quant_activation(x, quant)))
            continue

        def hook(_module, args, quant=quant):
            (x, *rest) = args
            return (fake_quant_activation(x, quant), *rest)

        handles.append(modules[name].register_forward_pre_hook(hook))
    return handles
