"""Exact bytes of a model's weights under a :class:`~wkvlab.weights.spec.WeightSpec`, whole and per GPU.

The spec is wkvlab's one weight language (``wkvlab.weights.parse``); the bytes of each matrix are
:func:`wkvlab.weights.storage.weight_storage_bytes`, the count ``wkvlab eval`` reports for a
measured model, and which spec a linear gets (``skip=``, ``override=``) is
:meth:`WeightSpec.for_linear`. What is added here is the deployment side: the inventory of a model
described by its config.json, what stays 16-bit (embeddings, lm_head, norms, biases, routers —
as vLLM/SGLang/TensorRT-LLM keep them), a GGUF file's layout, and tensor-parallel shards.

GGUF files (llama.cpp) differ: token embeddings are quantized too, the output matrix is Q6_K
(llama.cpp ``llama_tensor_get_type`` keeps it at Q6_K unless the file type is Q8_0; rows that are
not multiples of 256 fall back to Q8_0) and norms are stored as f32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import KV_HEADS, REPLICATED, ROW, Linear, leftover_inventory, linear_inventory
from wkvlab.weights.spec import GGML_FORMATS, WeightSpec
from wkvlab.weights.storage import weight_storage_bytes

# GGUF Q6_K: 256 weights in 210 bytes (ggml-common.h block_q6_K); needs rows divisible by 256,
# otherwise llama.cpp falls back to Q8_0 for that tensor.
_Q6K_BYTES, _Q6K_BLOCK = 210, 256
# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of 64 before
# splitting it across tensor-parallel ranks (DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


def as_weight_spec(weights: str | WeightSpec, model: ModelDescription | None = None) -> WeightSpec:
    """The spec of ``weights`` (parsed by the one weight grammar). Unquantized weights (``none``)
    are served in the checkpoint's 16-bit dtype, so a plan costs them as that cast."""
    spec = weights if isinstance(weights, WeightSpec) else WeightSpec.parse(str(weights))
    if spec.method == "none" and not spec.overrides:
        dtype = model.dtype if model is not None else "bf16"
        return WeightSpec.parse(dtype)
    return spec


def is_gguf(spec: WeightSpec) -> bool:
    """A llama.cpp block format: the checkpoint is a GGUF file."""
    return spec.format in GGML_FORMATS


@dataclass(frozen=True)
class Execution(JsonMixin):
    """How the GEMMs of a weight spec run: the tensor-core format and what dequantization costs."""

    compute: str  # bf16 | int8 | fp8 | fp4: the GEMM input format where the GPU runs it natively
    weight_only: bool  # dequantized to 16 bit before/inside the GEMM
    dequant_overhead: float  # extra GEMM time once compute-bound (see throughput.py)
    bits: int


# dequant_overhead: relative extra GEMM time of weight-only kernels once compute-bound; 0.25 / 0.10
# are this planner's assumptions (dequantization in front of an unchanged 16-bit GEMM), not
# measurements; LLM.int8()'s outlier decomposition runs part of each GEMM in fp16 (0.5).
_ACT_COMPUTE = {"int8-token": "int8", "int8-tensor": "int8", "fp8-token": "fp8", "fp8-tensor": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}


def execution(spec: WeightSpec) -> Execution:
    if spec.method in ("none", "cast"):
        return Execution("bf16", False, 0.0, 16)
    if spec.method == "llm-int8":
        return Execution("int8", False, 0.5, 8)
    compute = _ACT_COMPUTE.get(spec.activations, "bf16")
    weight_only = compute == "bf16"
    overhead = (0.25 if spec.bits <= 4 else 0.10) if weight_only else 0.0
    return Execution(compute, weight_only, overhead, spec.bits)


@dataclass(frozen=True)
class Shard(JsonMixin):
    """The part of a model one GPU holds."""

    tp: int = 1  # tensor-parallel ranks every matrix is split across (vLLM/SGLang)
    layers: tuple[int, ...] | None = None  # decoder layers on this GPU (pipeline stage); None = all
    embedding: bool = True  # the token embedding is on this GPU
    lm_head: bool = True  # the output matrix and final norm are on this GPU
    row_fraction: float = 1.0  # llama.cpp -sm row: share of every matrix's rows on this GPU


@dataclass(frozen=True)
class WeightPart(JsonMixin):
    name: str
    params: int
    bytes: int
    stored_as: str


@dataclass(frozen=True)
class WeightBytes(JsonMixin):
    """Bytes of all weights (or one GPU's shard); ``breakdown`` sums to ``total_bytes``."""

    weights: str
    total_bytes: int
    quantized_bytes: int  # linear layers in a quantized format, scales and zero points included
    leftover_bytes: int  # 16-bit (or f32) tensors: embeddings, lm_head, norms, skipped layers, ...
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


def shard_shape(lin: Linear, model: ModelDescription, tp: int) -> tuple[int, int]:
    """(out, in) of the piece of one matrix a tensor-parallel rank holds."""
    out, inp = lin.out_features, lin.in_features
    if tp == 1 or lin.parallel == REPLICATED:
        return out, inp
    if lin.parallel == ROW:
        return out, inp // tp
    if lin.parallel == KV_HEADS and tp > model.num_kv_heads:
        return out // model.num_kv_heads, inp  # one replicated KV head per rank
    return out // tp, inp


def weight_bytes(model: ModelDescription, weights: str | WeightSpec, shard: Shard = Shard()) -> WeightBytes:
    """Bytes of ``model`` stored under ``weights`` (exact, integer), whole or as one GPU's ``shard``."""
    spec = as_weight_spec(weights, model)
    bad = [i for i in spec.skip_layers if i >= model.num_layers]
    if bad:
        raise ConfigError(f"skip layers {bad} do not exist: {model.name} has layers 0..{model.num_layers - 1}")
    gguf = is_gguf(spec)
    half = 2  # model dtype bytes (bf16/fp16)
    held = set(range(model.num_layers) if shard.layers is None else shard.layers)
    quantized = skipped = expert = q_params = skipped_params = 0
    formats: set[str] = set()
    memo: dict[tuple, int] = {}  # layers repeat their shapes: cost each (shape, spec) once
    for lin in linear_inventory(model):
        if lin.layer not in held:
            continue
        out, inp = shard_shape(lin, model, shard.tp)
        params = out * inp * lin.count
        sub = spec.for_linear(lin.module_name, lin.layer, model.num_layers)
        if sub is None or sub.method == "cast":
            nbytes = math.ceil(params * half * shard.row_fraction)
            skipped, skipped_params = skipped + nbytes, skipped_params + params
            expert += nbytes if lin.routed_expert else 0
            continue
        key = (out, inp, id(sub))
        if key not in memo:
            static = 4 if sub.activations in ("int8-tensor", "fp8-tensor") else 0  # fp32 input scale
            memo[key] = math.ceil((weight_storage_bytes((out, inp), sub) + static) * shard.row_fraction)
        one = memo[key]
        quantized, q_params = quantized + one * lin.count, q_params + params
        formats.add(sub.label)
        if lin.routed_expert:
            expert += one * lin.count
    parts = [WeightPart("linear layers (values, scales, zero points)", q_params, quantized, "+".join(sorted(formats)) or "-")]
    if skipped_params:
        parts.append(WeightPart("16-bit linear layers (skip=, overrides)", skipped_params, skipped, model.dtype))
    by_kind: dict[str, int] = {}
    for item in leftover_inventory(model):
        if item.layer is not None and item.layer not in held:
            continue
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.params
    for kind, params in by_kind.items():
        part = _leftover_part(model, spec, kind, params, shard, gguf)
        if part is not None:
            parts.append(part)
    leftover = sum(p.bytes for p in parts[1:])
    leftover_params = sum(p.params for p in parts[1:] if p.stored_as in (model.dtype, "f32"))
    return WeightBytes(
        weights=spec.label, total_bytes=quantized + leftover, quantized_bytes=quantized, leftover_bytes=leftover,
        quantized_params=q_params + sum(p.params for p in parts[1:]) - leftover_params, leftover_params=leftover_params,
        routed_expert_bytes=expert, breakdown=tuple(parts))


def _leftover_part(model: ModelDescription, spec: WeightSpec, kind: str, params: int, shard: Shard, gguf: bool) -> WeightPart | None:
    h, half = model.hidden_size, 2
    # a tied embedding is also the output matrix: it is wherever either end is (llama.cpp copies it)
    if kind == "embedding" and not (shard.embedding or (model.tie_embeddings and shard.lm_head)):
        return None
    if kind == "lm_head" and not shard.lm_head:
        return None
    if kind in ("embedding", "lm_head"):
        if gguf:
            return _gguf_end(model, spec, kind, params)
        chosen = spec.quantize_embeddings if kind == "embedding" else spec.quantize_lm_head
        rows = -(-_padded_vocab(model.vocab_size, shard.tp) // shard.tp)
        if chosen and spec.method not in ("none", "cast"):
            end = spec.for_embeddings()
            return WeightPart(kind, rows * h, math.ceil(weight_storage_bytes((rows, h), end)), end.label)
        return WeightPart(kind, rows * h, rows * h * half, model.dtype)
    if kind in ("norm", "bias"):
        size = 4 if gguf else half  # GGUF keeps norms and biases in f32
        return WeightPart(kind, params, params * size, "f32" if gguf else model.dtype)
    if kind == "conv":
        params = -(-params // shard.tp)
    return WeightPart(kind, params, params * half, model.dtype)


def _padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING if tp > 1 else vocab


def _gguf_end(model: ModelDescription, spec: WeightSpec, kind: str, params: int) -> WeightPart:
    """The token embedding keeps the file's type; the output matrix (or the tied embedding standing
    in for it) gets llama.cpp's output type: Q6_K, Q8_0 in a Q8_0 file or when rows are not multiples of 256."""
    h = model.hidden_size
    is_output = kind == "lm_head" or model.tie_embeddings
    if is_output and spec.format != "q8_0" and h % _Q6K_BLOCK == 0:
        return WeightPart(kind, params, params // _Q6K_BLOCK * _Q6K_BYTES, "q6_K")
    sub = spec if not is_output else WeightSpec.parse("q8_0")
    return WeightPart(kind, params, math.ceil(weight_storage_bytes((model.vocab_size, h), sub)), sub.format)
