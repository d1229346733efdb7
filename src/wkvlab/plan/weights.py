"""Exact bytes of a model's weights in a given format, with what each part costs.

A format stores ``bits`` per weight plus its metadata: scales and zero points per group of
``group_size`` inputs (or per output row), per tensor, and GPTQ's ``g_idx`` (one int32 per input
feature). The definitions match ``wkvlab.weights.rtn.weight_storage_bytes`` for the formats both
know (tested), and wkvlab's general ``int<b>[-g<G>][-sym|-asym][-fmin]`` names are accepted. Linear layers inside the blocks are quantized; embeddings, lm_head, norms,
biases and routers stay in the model's 16-bit dtype, as vLLM/SGLang/TensorRT-LLM do by default.
GGUF formats (llama.cpp) differ: token embeddings are quantized too, the output matrix is Q6_K
(llama.cpp ``llama_tensor_get_type`` keeps it at Q6_K unless the file type is Q8_0) and norms are
stored as f32.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import leftover_inventory, linear_inventory


@dataclass(frozen=True)
class WeightFormat(JsonMixin):
    """How one weight matrix is stored and which GEMM it feeds."""

    name: str
    bits: int  # stored bits per weight value
    group_size: int | None = None  # inputs sharing a scale; None = one group per output row
    group_meta_bits: int = 0  # bits per group (or row): scale (+ zero point or minimum)
    tensor_scale_bytes: int = 0  # per matrix
    row_index_bytes: int = 0  # per input feature (GPTQ g_idx, int32)
    compute: str = "bf16"  # GEMM input format where the GPU runs it natively
    weight_only: bool = False  # dequantized to 16 bit before/inside the GEMM
    dequant_overhead: float = 0.0  # extra GEMM time when compute-bound (see throughput.py)
    gguf: bool = False
    description: str = ""


_16 = dict(bits=16, compute="bf16")
# dequant_overhead: relative extra GEMM time of weight-only kernels once compute-bound. The
# seed study 004 reports W4A16 slower than BF16 at batch >= 32 (dequantization in front of an
# unchanged FP16 GEMM); 0.25 / 0.10 are this planner's assumptions, not measurements.
FORMATS: Mapping[str, WeightFormat] = {f.name: f for f in (
    WeightFormat("bf16", **_16, description="16-bit reference"),
    WeightFormat("fp16", **_16, description="16-bit reference"),
    WeightFormat("int8", 8, group_meta_bits=16, weight_only=True, dequant_overhead=0.10,
                 description="INT8 per-channel symmetric, weight-only (W8A16), fp16 scales"),
    WeightFormat("int4-g128", 4, 128, group_meta_bits=16 + 4, weight_only=True,
                 dequant_overhead=0.25,
                 description="asymmetric 4-bit, group 128, fp16 scale + 4-bit zero (W4A16)"),
    WeightFormat("awq-int4-g128", 4, 128, group_meta_bits=16 + 4, weight_only=True,
                 dequant_overhead=0.25,
                 description="AWQ checkpoint: int32-packed qweight/qzeros, fp16 scales per group"),
    # GPTQ checkpoints also store g_idx (int32 per input feature), even without act-order.
    WeightFormat("gptq-int4-g128", 4, 128, group_meta_bits=16 + 4, row_index_bytes=4,
                 weight_only=True, dequant_overhead=0.25,
                 description="GPTQ checkpoint: like int4-g128 plus int32 g_idx"),
    WeightFormat("w8a8-int8", 8, group_meta_bits=16, compute="int8",
                 description="SmoothQuant-style W8A8: INT8 weights per channel, dynamic per-token "
                             "INT8 activations, INT8 GEMM"),
    # bitsandbytes stores one fp32 absmax (SCB) per output row; outlier columns (|x| > 6) are
    # multiplied in fp16 at run time, which makes it slow (LLM.int8() paper, Dettmers 2022).
    WeightFormat("llm-int8", 8, group_meta_bits=32, compute="int8", dequant_overhead=0.5,
                 description="LLM.int8(): INT8 vector-wise + fp16 outlier decomposition"),
    # fp32 scale per output row, as compressed-tensors stores FP8 checkpoints (and wkvlab
    # simulates them); vLLM's online `--quantization fp8` keeps one per tensor (< 0.1% less).
    WeightFormat("fp8", 8, group_meta_bits=32, compute="fp8",
                 description="FP8 E4M3 W8A8, per-channel weight scales, dynamic per-token activations"),
    WeightFormat("fp8-wo", 8, group_meta_bits=32, weight_only=True, dequant_overhead=0.10,
                 description="FP8 weights, BF16 activations (W8A16, FP8 Marlin)"),
    # NVFP4: E2M1 values, E4M3 scale per 16, plus fp32 global weight and input scales per matrix.
    WeightFormat("nvfp4", 4, 16, group_meta_bits=8, tensor_scale_bytes=8, compute="fp4",
                 description="NVFP4: E2M1 + E4M3 scale per 16 values + fp32 tensor scales"),
    WeightFormat("mxfp4", 4, 32, group_meta_bits=8, compute="fp4",
                 description="MXFP4: E2M1 + E8M0 scale per 32 values"),
    # GGUF blocks of 32: q8_0 = 32 int8 + fp16 d (34 B), q4_0 = 32 nibbles + fp16 d (18 B).
    WeightFormat("q8_0", 8, 32, group_meta_bits=16, weight_only=True, dequant_overhead=0.10,
                 gguf=True, description="GGUF Q8_0 (34 B per 32 weights)"),
    WeightFormat("q4_0", 4, 32, group_meta_bits=16, weight_only=True, dequant_overhead=0.25,
                 gguf=True, description="GGUF Q4_0 (18 B per 32 weights), output tensor Q6_K"),
)}

# GGUF Q6_K: 256 weights in 210 bytes (ggml-common.h block_q6_K); needs rows divisible by 256,
# otherwise llama.cpp falls back to Q8_0 for that tensor.
_Q6K_BYTES, _Q6K_BLOCK = 210, 256


@dataclass(frozen=True)
class WeightSpec(JsonMixin):
    """A weight format plus layers kept in 16 bit (``int4-g128;skip=0,79``)."""

    format: str
    skip_layers: tuple[int, ...] = ()

    def __str__(self) -> str:
        if not self.skip_layers:
            return self.format
        return f"{self.format};skip=" + ",".join(str(i) for i in self.skip_layers)


@dataclass(frozen=True)
class WeightPart(JsonMixin):
    name: str
    params: int
    bytes: int
    stored_as: str


@dataclass(frozen=True)
class WeightBytes(JsonMixin):
    """Bytes of all weights; ``breakdown`` sums to ``total_bytes``."""

    weights: str
    total_bytes: int
    value_bytes: int  # packed quantized values
    scale_bytes: int  # scales, zero points, g_idx
    leftover_bytes: int  # unquantized tensors (embeddings, lm_head, norms, skipped layers, ...)
    quantized_params: int
    leftover_params: int
    routed_expert_bytes: int  # part of the total that lives in routed experts (MoE)
    breakdown: tuple[WeightPart, ...]

    @property
    def gb(self) -> float:
        return self.total_bytes / 1e9

    @property
    def gib(self) -> float:
        return self.total_bytes / 2**30


def weight_format_names() -> tuple[str, ...]:
    return tuple(FORMATS)


_GENERIC = re.compile(r"int([2-8])(?:-g(\d+))?((?:-(?:sym|asym|fmin))*)")


def weight_format(name: str) -> WeightFormat:
    """A named format, or wkvlab's general ``int<b>[-g<G>][-sym|-asym][-fmin]`` (weight-only RTN)."""
    if name in FORMATS:
        return FORMATS[name]
    m = _GENERIC.fullmatch(name)
    flags = set(filter(None, m.group(3).split("-"))) if m else set()
    if not m or (m.group(2) is not None and int(m.group(2)) < 1) or {"sym", "asym"} <= flags:
        raise ConfigError(f"unknown weight format {name!r}; use one of: " + ", ".join(FORMATS)
                          + " or int<b>[-g<G>][-sym|-asym][-fmin]")
    bits, group = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    symmetric = "sym" in flags or (bits == 8 and not flags & {"asym", "fmin"})
    if symmetric and "fmin" in flags:
        raise ConfigError(f"{name!r}: -fmin (float minimum) only applies to asymmetric weights")
    # wkvlab.weights.rtn: fp16 scale per group, plus an integer zero point of `bits` bits or an
    # fp16 minimum (-fmin) when asymmetric.
    meta = 16 + (0 if symmetric else (16 if "fmin" in flags else bits))
    return WeightFormat(name, bits, group, group_meta_bits=meta, weight_only=True,
                        dequant_overhead=0.25 if bits <= 4 else 0.10,
                        description=f"INT{bits} RTN, {'symmetric' if symmetric else 'asymmetric'}, "
                                    + (f"groups of {group}" if group else "per output channel"))


def parse_weight_spec(spec: str | WeightSpec) -> WeightSpec:
    """Parse ``<format>[;skip=<layers>]``; layers as ``0,1,5-7``."""
    if isinstance(spec, WeightSpec):
        _format(spec.format)
        return spec
    parts = [p.strip() for p in str(spec).split(";") if p.strip()]
    if not parts:
        raise ConfigError("empty weight format; use one of: " + ", ".join(FORMATS))
    name = parts[0].lower()
    _format(name)
    skip: tuple[int, ...] = ()
    for item in parts[1:]:
        key, _, value = item.partition("=")
        if key.strip() != "skip" or not value:
            raise ConfigError(f"cannot read {item!r} in weight spec {spec!r}; use '<format>;skip=0,1'")
        skip = parse_layer_list(value)
    return WeightSpec(name, skip)


def parse_layer_list(text: str) -> tuple[int, ...]:
    """``"0,1,5-7"`` -> (0, 1, 5, 6, 7)."""
    out: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        try:
            if "-" in item:
                lo, hi = (int(x) for x in item.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(item))
        except ValueError:
            raise ConfigError(f"cannot read layer list {text!r}; write layers like 0,1,5-7") from None
    if any(i < 0 for i in out):
        raise ConfigError(f"negative layer index in {text!r}; layers count from 0")
    return tuple(sorted(out))


_format = weight_format


def matrix_bytes(fmt: WeightFormat, in_features: int, out_features: int) -> tuple[int, int]:
    """(value bytes, metadata bytes) of one out x in matrix; groups run along the input."""
    values = -(-in_features * out_features * fmt.bits // 8)
    groups_per_row = -(-in_features // fmt.group_size) if fmt.group_size else 1
    meta_bits = groups_per_row * out_features * fmt.group_meta_bits
    meta = -(-meta_bits // 8) + fmt.tensor_scale_bytes
    meta += in_features * fmt.row_index_bytes
    return values, meta


def weight_bytes(model: ModelDescription, weight_format: str | WeightSpec) -> WeightBytes:
    """Bytes of ``model`` stored as ``weight_format`` (exact, integer)."""
    spec = parse_weight_spec(weight_format)
    fmt = _format(spec.format)
    bad = [i for i in spec.skip_layers if i >= model.num_layers]
    if bad:
        raise ConfigError(f"skip layers {bad} do not exist: {model.name} has layers "
                          f"0..{model.num_layers - 1}")
    half = 2  # model dtype bytes (bf16/fp16)
    norm_bytes = 4 if fmt.gguf else half  # GGUF keeps norms and biases in f32
    values = meta = skipped = expert = 0
    q_params = skipped_params = 0
    for lin in linear_inventory(model):
        if lin.layer in spec.skip_layers:
            skipped += lin.params * half
            skipped_params += lin.params
            continue
        v, m = matrix_bytes(fmt, lin.in_features, lin.out_features)
        values, meta, q_params = values + v * lin.count, meta + m * lin.count, q_params + lin.params
        if lin.routed_expert:
            expert += (v + m) * lin.count
    parts: list[WeightPart] = [
        WeightPart("linear layers", q_params, values, fmt.name),
        WeightPart("scales / zero points / g_idx", 0, meta, "metadata"),
    ]
    if skipped_params:
        parts.append(WeightPart(f"skipped layers {list(spec.skip_layers)}", skipped_params, skipped,
                                model.dtype))
    leftover_params = skipped_params
    by_kind: dict[str, int] = {}
    for item in leftover_inventory(model):
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.params
    for kind, params in by_kind.items():
        leftover_params += params
        parts.append(_leftover_part(model, fmt, kind, params, half, norm_bytes))
    gguf_quantized = sum(p.params for p in parts[2:] if p.stored_as not in (model.dtype, "f32"))
    leftover_bytes = sum(p.bytes for p in parts[2:])
    return WeightBytes(
        weights=str(spec), total_bytes=sum(p.bytes for p in parts), value_bytes=values,
        scale_bytes=meta, leftover_bytes=leftover_bytes,
        quantized_params=q_params + gguf_quantized, leftover_params=leftover_params - gguf_quantized,
        routed_expert_bytes=expert, breakdown=tuple(parts))


def _leftover_part(model: ModelDescription, fmt: WeightFormat, kind: str, params: int, half: int,
                   norm_bytes: int) -> WeightPart:
    h = model.hidden_size
    if fmt.gguf and kind in ("embedding", "lm_head"):
        # The output matrix (or the tied embedding standing in for it) gets llama.cpp's output
        # type; an untied token embedding keeps the file's type.
        is_output = kind == "lm_head" or model.tie_embeddings
        sub = fmt if not is_output or fmt.name == "q8_0" else None
        if sub is None and h % _Q6K_BLOCK == 0:
            return WeightPart(kind, params, params // _Q6K_BLOCK * _Q6K_BYTES, "q6_K")
        sub = sub or FORMATS["q8_0"]  # llama.cpp's fallback when rows are not multiples of 256
        v, m = matrix_bytes(sub, h, model.vocab_size)
        return WeightPart(kind, params, v + m, sub.name)
    if kind in ("norm", "bias"):
        return WeightPart(kind, params, params * norm_bytes, "f32" if norm_bytes == 4 else model.dtype)
    return WeightPart(kind, params, params * half, model.dtype)

